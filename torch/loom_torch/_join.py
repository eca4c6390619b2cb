"""Uneven inputs (ParallelModule.join, as DDP's join()): one small allreduce per step says which
ranks still train; a rank whose inputs ended shadows its peers' steps with zero gradients and
applies the same updates; at the end every rank takes the model of the highest rank that trained
last."""
import torch
import torch.distributed as dist

from ._model_checks import broadcast_state


class _Join:
    """Mixed into _Engine (_engine.py)."""

    def join_round(self, training, broadcast):
        """Collective on the group, once per reduced step while join() is in force: which ranks
        still train (a rank that ran out of inputs says 0) and whether they broadcast the
        buffers in this forward. Returns the ranks still training."""
        flags = torch.zeros(self.world + 1, dtype=torch.int64)
        if training:
            flags[self.rank] = 1
            flags[self.world] = int(broadcast)
        dist.all_reduce(flags, group=self.group)
        mask = flags.tolist()
        training_ranks = [r for r in range(self.world) if mask[r]]
        options = self.joining
        if training_ranks:
            self.last_active = training_ranks
            if options["throw"] and len(training_ranks) < self.world:
                done = [r for r in range(self.world) if not mask[r]]
                raise RuntimeError(
                    "loom_torch.parallelize: rank(s) %s ran out of inputs while rank(s) %s still "
                    "train (join(throw_on_early_termination=True) raises on every rank; this is "
                    "rank %d)" % (", ".join(map(str, done)), ", ".join(map(str, training_ranks)),
                                  self.rank))
            self.next_scale = (1.0 if options["divide"] else
                               float(self.world) / len(training_ranks))
        return training_ranks, mask[self.world] > 0

    def shadow_step(self):
        """join(): this rank ran out of inputs, its peers still train: it takes part in their
        step as a backward with no gradient (zeros, as DDP's joined ranks), and applies the same
        averaged update to its own parameters, so it stays with them."""
        self._begin_backward(shadow=True)
        for i in range(len(self.params)):
            self.reducer.mark_unused(i)
        self.reducer.backward_done()
        self.in_backward = False
        self.awaiting_step = False
        self.synchronize()
        if self.defer_updates:  # the averages are in .grad: the step the peers take
            self.step_function(self.optimizer)

    def run_joined(self, net):
        """This rank's inputs ended inside join(): its peers' remaining steps, then the final
        model from the last rank(s) to train."""
        self.synchronize()
        while True:
            training, broadcast = self.join_round(False, False)
            if not training:
                break
            if broadcast:  # from the highest rank still training, as DDP's join
                net._broadcast_buffers(training[-1])
            self.shadow_step()
        # The last rank(s) to train hold the model every rank keeps (as DDP's join); with the
        # same hyperparameters everywhere it is what every rank computed already.
        self.synchronize()
        broadcast_state(net.process_group, self.module, self.last_active[-1])
