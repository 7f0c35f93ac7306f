from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Measurement(_message.Message):
    __slots__ = ("nodes", "replicas", "local_batch_size", "step_seconds", "sync_seconds")
    NODES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    replicas: int
    local_batch_size: int
    step_seconds: float
    sync_seconds: float
    def __init__(self, nodes: _Optional[int] = ..., replicas: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., step_seconds: _Optional[float] = ..., sync_seconds: _Optional[float] = ...) -> None: ...

class GradientStats(_message.Message):
    __slots__ = ("base_batch_size", "grad_sqr", "grad_var")
    BASE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    GRAD_SQR_FIELD_NUMBER: _ClassVar[int]
    GRAD_VAR_FIELD_NUMBER: _ClassVar[int]
    base_batch_size: int
    grad_sqr: float
    grad_var: float
    def __init__(self, base_batch_size: _Optional[int] = ..., grad_sqr: _Optional[float] = ..., grad_var: _Optional[float] = ...) -> None: ...

class InputPoint(_message.Message):
    __slots__ = ("cores", "samples_per_second")
    CORES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    cores: float
    samples_per_second: float
    def __init__(self, cores: _Optional[float] = ..., samples_per_second: _Optional[float] = ...) -> None: ...

class ScalingParams(_message.Message):
    __slots__ = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")
    ALPHA_C_FIELD_NUMBER: _ClassVar[int]
    BETA_C_FIELD_NUMBER: _ClassVar[int]
    ALPHA_N_FIELD_NUMBER: _ClassVar[int]
    BETA_N_FIELD_NUMBER: _ClassVar[int]
    ALPHA_R_FIELD_NUMBER: _ClassVar[int]
    BETA_R_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    def __init__(self, alpha_c: _Optional[float] = ..., beta_c: _Optional[float] = ..., alpha_n: _Optional[float] = ..., beta_n: _Optional[float] = ..., alpha_r: _Optional[float] = ..., beta_r: _Optional[float] = ..., gamma: _Optional[float] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("job_id", "min_gpus", "max_gpus", "requested_gpus", "batch_size", "min_batch_size", "max_batch_size", "min_local_batch_size", "max_local_batch_size", "priority", "restart_seconds", "scaling", "measurements", "gradient", "input_curve")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_GPUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RESTART_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    INPUT_CURVE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    min_gpus: int
    max_gpus: int
    requested_gpus: int
    batch_size: int
    min_batch_size: int
    max_batch_size: int
    min_local_batch_size: int
    max_local_batch_size: int
    priority: float
    restart_seconds: float
    scaling: ScalingParams
    measurements: _containers.RepeatedCompositeFieldContainer[Measurement]
    gradient: GradientStats
    input_curve: _containers.RepeatedCompositeFieldContainer[InputPoint]
    def __init__(self, job_id: _Optional[str] = ..., min_gpus: _Optional[int] = ..., max_gpus: _Optional[int] = ..., requested_gpus: _Optional[int] = ..., batch_size: _Optional[int] = ..., min_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., min_local_batch_size: _Optional[int] = ..., max_local_batch_size: _Optional[int] = ..., priority: _Optional[float] = ..., restart_seconds: _Optional[float] = ..., scaling: _Optional[_Union[ScalingParams, _Mapping]] = ..., measurements: _Optional[_Iterable[_Union[Measurement, _Mapping]]] = ..., gradient: _Optional[_Union[GradientStats, _Mapping]] = ..., input_curve: _Optional[_Iterable[_Union[InputPoint, _Mapping]]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id", "queue_position", "token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    queue_position: int
    token: str
    def __init__(self, job_id: _Optional[str] = ..., queue_position: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class UpdateJobRequest(_message.Message):
    __slots__ = ("job_id", "measurements", "gradient", "priority", "token", "done")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    measurements: _containers.RepeatedCompositeFieldContainer[Measurement]
    gradient: GradientStats
    priority: float
    token: str
    done: float
    def __init__(self, job_id: _Optional[str] = ..., measurements: _Optional[_Iterable[_Union[Measurement, _Mapping]]] = ..., gradient: _Optional[_Union[GradientStats, _Mapping]] = ..., priority: _Optional[float] = ..., token: _Optional[str] = ..., done: _Optional[float] = ...) -> None: ...

class UpdateJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CompleteJobRequest(_message.Message):
    __slots__ = ("job_id", "failed", "token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    failed: bool
    token: str
    def __init__(self, job_id: _Optional[str] = ..., failed: _Optional[bool] = ..., token: _Optional[str] = ...) -> None: ...

class CompleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "gpus", "sidecar_address", "host", "cpus", "lends")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    LENDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpus: int
    sidecar_address: str
    host: str
    cpus: float
    lends: bool
    def __init__(self, node_id: _Optional[str] = ..., gpus: _Optional[int] = ..., sidecar_address: _Optional[str] = ..., host: _Optional[str] = ..., cpus: _Optional[float] = ..., lends: _Optional[bool] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeJobReport(_message.Message):
    __slots__ = ("job_id", "samples_per_second", "batch_size", "measurements", "gradient", "input_curve", "remote_cores_max", "done")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    INPUT_CURVE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CORES_MAX_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    samples_per_second: float
    batch_size: int
    measurements: _containers.RepeatedCompositeFieldContainer[Measurement]
    gradient: GradientStats
    input_curve: _containers.RepeatedCompositeFieldContainer[InputPoint]
    remote_cores_max: float
    done: float
    def __init__(self, job_id: _Optional[str] = ..., samples_per_second: _Optional[float] = ..., batch_size: _Optional[int] = ..., measurements: _Optional[_Iterable[_Union[Measurement, _Mapping]]] = ..., gradient: _Optional[_Union[GradientStats, _Mapping]] = ..., input_curve: _Optional[_Iterable[_Union[InputPoint, _Mapping]]] = ..., remote_cores_max: _Optional[float] = ..., done: _Optional[float] = ...) -> None: ...

class ReportNodeRequest(_message.Message):
    __slots__ = ("node_id", "free_gpus", "jobs")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    free_gpus: int
    jobs: _containers.RepeatedCompositeFieldContainer[NodeJobReport]
    def __init__(self, node_id: _Optional[str] = ..., free_gpus: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[NodeJobReport, _Mapping]]] = ...) -> None: ...

class ReportNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeShare(_message.Message):
    __slots__ = ("node_id", "gpus", "cpus")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpus: int
    cpus: float
    def __init__(self, node_id: _Optional[str] = ..., gpus: _Optional[int] = ..., cpus: _Optional[float] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("job_id", "gpus", "nodes", "batch_size", "reason", "queue_position", "rendezvous", "generation", "local_batch_size", "accumulation_steps", "key_digest", "remote_cpus", "done", "lent_cpus")
    class LentCpusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATION_STEPS_FIELD_NUMBER: _ClassVar[int]
    KEY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CPUS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    LENT_CPUS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    gpus: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeShare]
    batch_size: int
    reason: str
    queue_position: int
    rendezvous: str
    generation: int
    local_batch_size: int
    accumulation_steps: int
    key_digest: str
    remote_cpus: float
    done: float
    lent_cpus: _containers.ScalarMap[str, float]
    def __init__(self, job_id: _Optional[str] = ..., gpus: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeShare, _Mapping]]] = ..., batch_size: _Optional[int] = ..., reason: _Optional[str] = ..., queue_position: _Optional[int] = ..., rendezvous: _Optional[str] = ..., generation: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., accumulation_steps: _Optional[int] = ..., key_digest: _Optional[str] = ..., remote_cpus: _Optional[float] = ..., done: _Optional[float] = ..., lent_cpus: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetAllocationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AllocationSet(_message.Message):
    __slots__ = ("version", "dry_run", "policy", "allocations", "decided_at", "decision_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    dry_run: bool
    policy: str
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    decided_at: float
    decision_ms: float
    def __init__(self, version: _Optional[int] = ..., dry_run: _Optional[bool] = ..., policy: _Optional[str] = ..., allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ..., decided_at: _Optional[float] = ..., decision_ms: _Optional[float] = ...) -> None: ...

class WatchAllocationsRequest(_message.Message):
    __slots__ = ("job_id", "node_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node_id: str
    def __init__(self, job_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("config", "set_dry_run")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SET_DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    config: AllocatorConfig
    set_dry_run: bool
    def __init__(self, config: _Optional[_Union[AllocatorConfig, _Mapping]] = ..., set_dry_run: _Optional[bool] = ...) -> None: ...

class AllocatorConfig(_message.Message):
    __slots__ = ("policy", "interval_seconds", "dry_run", "restart_seconds")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    RESTART_SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    interval_seconds: float
    dry_run: bool
    restart_seconds: float
    def __init__(self, policy: _Optional[str] = ..., interval_seconds: _Optional[float] = ..., dry_run: _Optional[bool] = ..., restart_seconds: _Optional[float] = ...) -> None: ...
