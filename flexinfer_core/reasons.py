"""The one vocabulary of reasons.

Every decision carries one of these CamelCase constants. The controller copies them
into status conditions, Kubernetes Events and logs; `flexinfer explain` prints
them. Nothing else in the project invents reason strings.
"""

from __future__ import annotations

from typing import Final

# Why the shared-group election picked its leader (docs/election.md 1.2).
EMPTY_GROUP: Final = "EmptyGroup"
# One spelling for the election, the members' conditions and the Events (spec 1.3).
GPU_LEASE_HELD: Final = "GPULeaseHeld"
FORCE_PROMOTED: Final = "ForcePromoted"
SWAP_COOLDOWN: Final = "SwapCooldown"
LOADING_HOLDER: Final = "LoadingHolder"
DEMAND_PREEMPTION: Final = "DemandPreemption"
READY_LEADER: Final = "ReadyLeader"
# The group's default member (docs/election.md 1.5): it yields once it only stays warm,
# and takes the card back once nobody else is demanded and the holder has idled out.
DEFAULT_YIELDS: Final = "DefaultYields"
RETURN_TO_DEFAULT: Final = "ReturnToDefault"
RECENT_DEMAND: Final = "RecentDemand"
FALLBACK: Final = "Fallback"

ELECTION_REASONS: Final = frozenset(
    {
        EMPTY_GROUP,
        GPU_LEASE_HELD,
        FORCE_PROMOTED,
        SWAP_COOLDOWN,
        LOADING_HOLDER,
        DEMAND_PREEMPTION,
        DEFAULT_YIELDS,
        RETURN_TO_DEFAULT,
        READY_LEADER,
        RECENT_DEMAND,
        FALLBACK,
    }
)

# Per-member condition and Event reasons (docs/election.md 1.3); a member parked by
# a lease says GPU_LEASE_HELD, like the election.
PREEMPTED: Final = "Preempted"
PROMOTED: Final = "Promoted"
WAITING_FOR_GPU: Final = "WaitingForGPU"
QUEUED: Final = "Queued"
ACTIVE: Final = "Active"
# A recorded lastActiveTime or preemptedAt that lay in the future, read as now.
TIMESTAMP_IN_FUTURE: Final = "TimestampInFuture"

# GPUGroup decisions (docs/election.md section 3).
KEEP_CURRENT: Final = "KeepCurrent"
IDLE_TIMEOUT: Final = "IdleTimeout"
NO_DEMAND: Final = "NoDemand"
QUEUE_BELOW_THRESHOLD: Final = "QueueBelowThreshold"
HYSTERESIS: Final = "Hysteresis"
MINIMUM_RUN: Final = "MinimumRunDuration"
COOLDOWN_AFTER_PREEMPTION: Final = "CooldownAfterPreemption"
SWAP: Final = "Swap"
START: Final = "Start"
DRAINING: Final = "Draining"
DRAIN_TIMEOUT: Final = "DrainTimeout"

# Finetune lease lifecycle (docs/election.md section 2).
LEASE_ACQUIRE: Final = "LeaseAcquire"
LEASE_REFRESH: Final = "LeaseRefresh"
LEASE_CURRENT: Final = "LeaseCurrent"
LEASE_RELEASE: Final = "LeaseRelease"
LEASE_NOT_NEEDED: Final = "LeaseNotNeeded"
# A lease (ConfigMap or GPULease) whose fields cannot be read: it parks nothing.
GPU_LEASE_UNREADABLE: Final = "GPULeaseUnreadable"

# GPUGroup membership of a ModelDeployment (flexinfer_core.membership).
GPU_GROUP_MEMBER: Final = "GPUGroupMember"
GPU_GROUP_REF_NOT_LISTED: Final = "GPUGroupRefNotListed"
LISTED_BY_MULTIPLE_GPU_GROUPS: Final = "ListedByMultipleGPUGroups"

# A member whose server is failing (flexinfer_core.phases): the kubelet's word for it.
CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"

# Standalone ModelDeployments (docs/election.md section 4).
IN_USE: Final = "InUse"
COLD_START: Final = "ColdStart"
IDLE_SCALE_TO_ZERO: Final = "IdleScaleToZero"
IDLE_MIN_REPLICAS: Final = "IdleMinReplicas"
DEMAND_SCALE_UP: Final = "DemandScaleUp"

# Rendering: the `Rendered`, `CacheReady` and `VRAMFits` conditions of Models and
# ModelDeployments, and the ModelCache's own (flexinfer_k8s.render).
RENDERED: Final = "Rendered"
INVALID_SPEC: Final = "InvalidSpec"
NAME_CLASH: Final = "NameClash"
CACHE_NOT_FOUND: Final = "CacheNotFound"
CACHE_NOT_READY: Final = "CacheNotReady"
CACHE_FAILED: Final = "CacheFailed"
CACHE_READY: Final = "CacheReady"
KV_CACHE_FITS: Final = "KVCacheFits"
KV_CACHE_EXCEEDS_GPU_MEMORY: Final = "KVCacheExceedsGPUMemory"
DOWNLOADING: Final = "Downloading"
DOWNLOAD_FAILED: Final = "DownloadFailed"
CLAIM_PENDING: Final = "ClaimPending"
JOB_POD_REFUSED: Final = "JobPodRefused"
CLAIM_BOUND: Final = "ClaimBound"
REPLICAS_GOVERNED: Final = "ReplicasGoverned"
FINETUNING: Final = "Finetuning"
FINETUNE_FAILED: Final = "FinetuneFailed"
# A ModelCache's directory and its life (flexinfer_k8s.render.cache_dir).
ADOPTED: Final = "Adopted"
FOREIGN_DIRECTORY: Final = "ForeignDirectory"
NO_MODEL: Final = "NoModel"
FINETUNE_UNSCHEDULABLE: Final = "FinetuneUnschedulable"
DELETING: Final = "Deleting"
CLEANED_UP: Final = "CleanedUp"
CLEANUP_FAILED: Final = "CleanupFailed"

# VRAM co-residency (docs/election.md 1.7): why a member is or is not packed beside
# the leader, and why a group with a budget is not packed.
CO_RESIDENT: Final = "CoResident"
WAITING_FOR_VRAM: Final = "WaitingForVram"
EVICTED_FOR_VRAM: Final = "EvictedForVram"
VRAM_BUDGET_CONFLICT: Final = "VramBudgetConflict"
# The `Packed` condition of a member whose group set a budget once and no longer does.
NO_VRAM_BUDGET: Final = "NoVramBudget"
# A group with a budget on a cluster whose pods cannot share a card (no DRA driver).
NO_SHARED_CARD: Final = "NoSharedCard"
# A GPUGroup with a budget (its `Packed` condition): one holder within the budget, with
# room for others beside it; or a holder that takes the card alone (its footprint is
# unknown, or above the budget).
FITS: Final = "Fits"
EXCLUSIVE: Final = "Exclusive"
