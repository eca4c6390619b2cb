"""Gradient compression by name, one table for parallelize and the DDP hook."""

_NAMES = {None: "none", "none": "none", "float16": "float16", "fp16": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


def compression_name(value, who):
    """loom's name for `value` ("none", "float16" or "bfloat16"); ValueError naming `who`."""
    try:
        return _NAMES[value]
    except (KeyError, TypeError):
        raise ValueError("%s: compression must be None, 'float16' or 'bfloat16' ('fp16', "
                         "'bf16'), not %r" % (who, value)) from None
