// Compiled by tests/layers/CMakeLists.txt inside one layer with a header of a layer above it:
// the build must refuse it (the layer's include directories do not reach upward).
#include LOOM_PROBE_HEADER
