"""The engine's plan: DDP's rebuild of the buckets after the first step, and the automatic plan
(the default, bucket_cap_mb="auto"): profiled steps ranked by the step simulator, the shortlist
timed one step per plan in turn, the fastest kept, at the same step on every rank."""
from . import _C


class _Planning:
    """Mixed into _Engine (_engine.py): the plan in force and how it changes between steps."""

    # bucket_cap_mb="auto": what is searched, after how many profiled steps, and how the
    # shortlist is timed (PlanSearch::for_gradient_reducer, the C++ side's one definition): the
    # running plan and the best predicted that beat it run one step each in turn, the first
    # round not counted, and rank 0's periods decide, each plan's taken against the running
    # plan's in the same round (PlanTrials::steps_s): the simulator ranks, the clock chooses.
    search = _C.PlanSearch.for_gradient_reducer()

    def _record_step(self, now):
        # The step that just finished, up to now (the next begin()), for the simulator.
        if self.t0 is None:
            return
        end = now - self.t0
        self.t0 = None
        self.last_period = end * 1e-9
        if not self.timeline_forward:
            return  # no forward since its backward: nothing to gate on its updates
        s = 1e-9
        self.reducer.record_step(
            end * s,
            [(name, indices, entered * s, resumed * s)
             for name, indices, entered, resumed in self.timeline_forward],
            self.timeline_forward_end * s,
            [(k, start * s, stop * s) for k, start, stop in self.timeline_updates],
            [(start * s, stop * s) for start, stop in self.timeline_waits])

    def _plan_automatically(self):
        # Collective, at the same step on every rank: rank 0 ranks the plans from its profiled
        # steps and shares its shortlist, which then runs one step per plan in turn.
        self.automatic = False
        self.last_period = None
        self._release_views()
        if self.activation_bytes is not None:
            self.search.activation_bytes = int(self.activation_bytes)
        chosen = self.reducer.shortlist_plans(self.search)
        if chosen is not None:  # no plan predicted faster than the running one: nothing to time
            self._decided(chosen)
        else:  # the trials begin with the running plan
            self._layout()

    def _time_plans(self):
        # Collective: every rank records the period it measured (rank 0's decide) and moves to
        # the next trial plan, or to the fastest once every plan ran its rounds.
        self._release_views()
        chosen = self.reducer.trial_step(self.last_period)
        self.last_period = None
        if chosen is None:
            self._layout()
        else:
            self._decided(chosen)

    def _decided(self, chosen):
        self.automatic_plan = chosen.summary()
        self.plan = chosen.plan
        self.steps_since_plan = 0
        self._layout()

    def _rebuild_buckets(self):
        # As DDP after its first iteration: buckets filled in the order the gradients became
        # ready in the first step, rank 0's order on every rank (a collective, at the same point
        # of every rank's second backward).
        if self.reducer.observed_ready_order():
            self.rebuild_pending = False
            self.replan_agreed()

    def replan_agreed(self, issue_order=()):
        """Rebuilds the buckets with self.plan, filled in rank 0's observed ready order when
        there is one (a collective: every rank, at the same point)."""
        order = self.reducer.observed_ready_order()
        if order:  # rank 0's, so that every rank builds the same buckets
            order = self.reducer.agreed(order)
        plan = self.plan.copy()
        plan.ready_order = list(order)
        plan.issue_order = list(issue_order)
        self._release_views()
        self.reducer.replan(plan)
        self.steps_since_plan = 0
        self._layout()
