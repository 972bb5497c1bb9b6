"""A shared group simulated over time: the controller loop, the workload and the proxy.

The machine plays the controller faithfully: after every event it reconciles
(observe phases from pods, decide, apply the decision, let the Deployments react)
until nothing more changes, and it wakes at every instant the workload or the
decision's `next_change_at` names. Pods take their member's load time to become
ready and its termination time to go away. Invariants: at most one member has pods
at any moment (break-before-make; terminating pods count), at most one leader,
and under an active lease nobody is scaled up. The liveness rule checks that a
continuously demanded model of strictly the highest priority is serving within the
remaining cooldown plus the old holder's termination plus its own load time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flexinfer_core import (
    GpuLease,
    GroupDecision,
    ModelState,
    Phase,
    SharedState,
    apply_decision,
    decide_group,
    observed_phase,
)
from flexinfer_core.testing import oracle
from flexinfer_core.testing.strategies import (
    EPOCH,
    GROUP,
    NAMESPACE,
    SimMember,
    active_lease,
    durations,
    sim_groups,
)

_MAX_RECONCILES = 10
_MAX_WAKEUPS = 500


@attrs.define
class Pods:
    """One member's pods: live ones (ready at `ready_at`) and terminating ones."""

    ready_at: datetime | None = None  # None: no live pods
    terminating_until: datetime | None = None  # None: no terminating pods

    @property
    def live(self) -> bool:
        return self.ready_at is not None

    @property
    def present(self) -> bool:
        return self.live or self.terminating_until is not None


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = EPOCH
        self.models: dict[str, ModelState] = {}
        self.sim: dict[str, SimMember] = {}
        self.pods: dict[str, Pods] = {}
        self.leases: list[GpuLease] = []
        self.decision: GroupDecision | None = None
        self.always_demanded: str | None = None
        self.lease_serial = 0

    # --- the controller loop ----------------------------------------------------------

    def settle_pods(self) -> None:
        for pods in self.pods.values():
            if pods.terminating_until is not None and self.now >= pods.terminating_until:
                pods.terminating_until = None

    def observe_phases(self) -> bool:
        changed = False
        for name, model in self.models.items():
            pods = self.pods[name]
            ready = pods.ready_at is not None and self.now >= pods.ready_at
            phase = observed_phase(
                model.phase,
                replicas=model.replicas or 0,
                pods=int(pods.live),
                ready_pods=int(ready),
            )
            if phase is not model.phase:
                self.models[name] = attrs.evolve(model, phase=phase)
                changed = True
        return changed

    def scale(self) -> bool:
        """The Deployments follow the replicas just written."""
        changed = False
        for name, model in self.models.items():
            pods = self.pods[name]
            if (model.replicas or 0) > 0 and not pods.live:
                others = [n for n, p in self.pods.items() if n != name and p.present]
                assert not others, f"{name} scaled up while {others} still have pods"
                pods.ready_at = self.now + self.sim[name].load_time
                if self.models[name].preempted_by is not None and any(
                    m.preempted_at is not None for m in self.models.values()
                ):
                    event("a member scaled up after a preemption")
                changed = True
            elif (model.replicas or 0) == 0 and pods.live:
                until = self.now + self.sim[name].termination_time
                if pods.terminating_until is None or pods.terminating_until < until:
                    pods.terminating_until = until
                pods.ready_at = None
                changed = True
        self.settle_pods()
        return changed

    def reconcile(self) -> None:
        for _ in range(_MAX_RECONCILES):
            if self.always_demanded is not None:
                name = self.always_demanded
                self.models[name] = attrs.evolve(self.models[name], last_active=self.now)
            self.settle_pods()
            observed = self.observe_phases()
            running = frozenset(n for n, p in self.pods.items() if p.present)
            models = tuple(self.models.values())
            decision = decide_group(models, now=self.now, leases=self.leases, running=running)
            writes = decision.changes(models)
            self.models = {m.name: m for m in apply_decision(models, decision)}
            self.decision = decision
            scaled = self.scale()
            if not (observed or writes or scaled):
                return
        raise AssertionError(f"no fixed point after {_MAX_RECONCILES} reconciles at {self.now}")

    def next_wakeup(self) -> datetime | None:
        """The earliest future instant something happens with no new event."""
        times = [p.ready_at for p in self.pods.values() if p.ready_at is not None]
        times += [p.terminating_until for p in self.pods.values() if p.terminating_until]
        times += [x.expires_at for x in self.leases if x.expires_at is not None]
        if self.decision is not None and self.decision.next_change_at is not None:
            times.append(self.decision.next_change_at)
        return min((t for t in times if t > self.now), default=None)

    def run_until(self, target: datetime) -> None:
        for _ in range(_MAX_WAKEUPS):
            wake = self.next_wakeup()
            if wake is None or wake > target:
                break
            self.now = wake
            self.reconcile()
        else:
            raise AssertionError(f"more than {_MAX_WAKEUPS} wake-ups before {target}")
        self.now = target
        self.reconcile()

    def name_at(self, index: int) -> str:
        names = sorted(self.models)
        return names[index % len(names)]

    # --- rules ---------------------------------------------------------------------------

    @initialize(members=sim_groups())
    def create_group(self, members: tuple[SimMember, ...]) -> None:
        for member in members:
            self.sim[member.model.name] = member
            self.models[member.model.name] = member.model
            self.pods[member.model.name] = Pods()
        self.reconcile()

    @rule(dt=durations(900))
    def time_passes(self, dt: timedelta) -> None:
        self.run_until(self.now + dt)

    @rule(index=st.integers(0, 6))
    def demand(self, index: int) -> None:
        """The proxy records a request for the member (or a served one refreshes it)."""
        name = self.name_at(index)
        self.models[name] = attrs.evolve(self.models[name], last_active=self.now)
        self.reconcile()

    @rule(ttl=st.one_of(st.none(), durations(900)))
    def create_lease(self, ttl: timedelta | None) -> None:
        self.lease_serial += 1
        self.leases.append(
            GpuLease(
                name=f"finetune-{self.lease_serial}-gpu-lease",
                group=GROUP,
                namespace=NAMESPACE,
                owner=f"finetune-{self.lease_serial}",
                expires_at=None if ttl is None else self.now + ttl,
            )
        )
        self.reconcile()

    @precondition(lambda self: bool(self.leases))
    @rule(index=st.integers(0, 3))
    def delete_lease(self, index: int) -> None:
        del self.leases[index % len(self.leases)]
        self.reconcile()

    @precondition(lambda self: any(x.expires_at is not None for x in self.leases))
    @rule()
    def lease_expires(self) -> None:
        expiries = [x.expires_at for x in self.leases if x.expires_at is not None]
        self.run_until(max(self.now, min(expiries)))

    @rule(index=st.integers(0, 6))
    def load_completes(self, index: int) -> None:
        """A load may finish sooner than the member's worst case."""
        pods = self.pods[self.name_at(index)]
        if pods.ready_at is not None and pods.ready_at > self.now:
            pods.ready_at = self.now
        self.reconcile()

    @rule(index=st.integers(0, 6))
    def pods_terminate(self, index: int) -> None:
        """Terminating pods may go away sooner than the grace period."""
        pods = self.pods[self.name_at(index)]
        if pods.terminating_until is not None:
            pods.terminating_until = self.now
        self.reconcile()

    @rule()
    def rollout_restart_of_the_leader(self) -> None:
        """`kubectl rollout restart`: the leader's pods start over (Ready -> Loading)."""
        leader = self.decision.leader if self.decision is not None else None
        if leader is None or not self.pods[leader].live:
            return
        self.pods[leader].ready_at = self.now + self.sim[leader].load_time
        self.reconcile()

    def promote_to_top(self, name: str) -> bool:
        """Make `name` strictly the most important runnable member, as a user would by
        editing its spec; False when that cannot be done within the spec's ranges."""
        model = self.models[name]
        others = [m for m in self.models.values() if m.name != name]
        if any(m.force_promotion for m in others):
            return False  # forcePromotion outranks priority by design (rule 3)
        if model.serverless.enabled and model.serverless.idle_timeout < timedelta(seconds=1):
            # idleTimeout 0 scales down the instant demand pauses; "continuously
            # demanded" would need a request every microsecond, which no proxy makes.
            return False
        top = max(m.priority for m in others)
        if top >= 1000:
            return False
        self.models[name] = attrs.evolve(
            model, priority=max(model.priority, top + 1), cache_ready=True
        )
        return True

    @rule(index=st.integers(0, 6))
    def keep_demanding_the_most_important_model(self, index: int) -> None:
        """Liveness: demanded continuously and strictly most important, it serves in time."""
        name = self.name_at(index)
        if not self.promote_to_top(name):
            return
        holder = self.decision.leader if self.decision is not None else None
        if holder not in (None, name):
            event("liveness: takes the card from another leader")
        self.leases.clear()
        self.always_demanded = name
        self.reconcile()
        start = self.now
        models = list(self.models.values())
        cooldown_left = max(
            (
                m.preempted_at + oracle.cooldown(models) - start
                for m in models
                if m.preempted_at is not None
            ),
            default=timedelta(0),
        )
        # Whoever holds the card when the cooldown ends is the old holder; any member may be.
        termination = max(self.sim[n].termination_time for n in self.models if n != name)
        cooldown_left = max(cooldown_left, timedelta(0))
        event("liveness: waits out a cooldown" if cooldown_left else "liveness: no cooldown")
        leads_by = start + cooldown_left
        deadline = leads_by + termination + self.sim[name].load_time
        led_at: datetime | None = None
        served_at: datetime | None = None
        for _ in range(_MAX_WAKEUPS):
            assert self.decision is not None
            model = self.models[name]
            if self.decision.leader == name and led_at is None:
                led_at = self.now
            if led_at is not None and (model.replicas or 0) == 0:
                event("liveness: leads, waits for another member's pods")
            if (
                self.decision.leader == name
                and (model.replicas or 0) > 0
                and model.phase is Phase.READY
            ):
                served_at = self.now
                break
            wake = self.next_wakeup()
            if wake is None or wake > deadline:
                break
            self.now = wake
            self.reconcile()
        self.always_demanded = None
        context = (
            f"(cooldown left {cooldown_left}, termination {termination}, load "
            f"{self.sim[name].load_time}); at {self.now}: leader "
            f"{self.decision.leader if self.decision else None}, phase "
            f"{self.models[name].phase}, replicas {self.models[name].replicas}"
        )
        assert led_at is not None and led_at <= leads_by, (
            f"{name} not leading by {leads_by} {context}"
        )
        assert served_at is not None and served_at <= deadline, (
            f"{name} not serving by {deadline} {context}"
        )

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def break_before_make(self) -> None:
        with_pods = [n for n, p in self.pods.items() if p.present]
        assert len(with_pods) <= 1, f"several members have pods at {self.now}: {with_pods}"

    @invariant()
    def at_most_one_leader(self) -> None:
        active = [n for n, m in self.models.items() if m.shared_state is SharedState.ACTIVE]
        assert len(active) <= 1, active
        scaled = [n for n, m in self.models.items() if (m.replicas or 0) > 0]
        assert len(scaled) <= 1, scaled

    @invariant()
    def lease_parks_everyone(self) -> None:
        if active_lease(self.leases, self.now):
            assert all((m.replicas or 0) == 0 for m in self.models.values())
            assert all(not p.live for p in self.pods.values())
            assert self.decision is not None and self.decision.leader is None


GroupMachine.TestCase.settings = settings(settings.default, stateful_step_count=20)
TestGroupMachine = GroupMachine.TestCase
