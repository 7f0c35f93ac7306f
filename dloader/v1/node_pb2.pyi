from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobLimits(_message.Message):
    __slots__ = ("min_workers", "max_workers", "min_batch_size", "max_batch_size", "may_change_batch_size", "max_remote_workers")
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAY_CHANGE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_REMOTE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    min_workers: int
    max_workers: int
    min_batch_size: int
    max_batch_size: int
    may_change_batch_size: bool
    max_remote_workers: int
    def __init__(self, min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., min_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., may_change_batch_size: _Optional[bool] = ..., max_remote_workers: _Optional[int] = ...) -> None: ...

class RegisterJobRequest(_message.Message):
    __slots__ = ("name", "limits", "pids", "gpus", "num_workers", "batch_size", "job_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    limits: JobLimits
    pids: _containers.RepeatedScalarFieldContainer[int]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    num_workers: int
    batch_size: int
    job_key: str
    def __init__(self, name: _Optional[str] = ..., limits: _Optional[_Union[JobLimits, _Mapping]] = ..., pids: _Optional[_Iterable[int]] = ..., gpus: _Optional[_Iterable[int]] = ..., num_workers: _Optional[int] = ..., batch_size: _Optional[int] = ..., job_key: _Optional[str] = ...) -> None: ...

class RegisterJobResponse(_message.Message):
    __slots__ = ("job_id", "token", "directive")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: str
    directive: Directive
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[str] = ..., directive: _Optional[_Union[Directive, _Mapping]] = ...) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("pid", "fetch_seconds", "cpu_seconds", "batches", "run_delay_seconds", "window_batches")
    PID_FIELD_NUMBER: _ClassVar[int]
    FETCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RUN_DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BATCHES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    fetch_seconds: float
    cpu_seconds: float
    batches: int
    run_delay_seconds: float
    window_batches: int
    def __init__(self, pid: _Optional[int] = ..., fetch_seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., batches: _Optional[int] = ..., run_delay_seconds: _Optional[float] = ..., window_batches: _Optional[int] = ...) -> None: ...

class JobReport(_message.Message):
    __slots__ = ("job_id", "token", "timestamp", "num_workers", "batch_size", "samples_per_second", "idle_share", "step_seconds", "wait_seconds", "window_seconds", "samples", "workers", "done")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    IDLE_SHARE_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: str
    timestamp: float
    num_workers: int
    batch_size: int
    samples_per_second: float
    idle_share: float
    step_seconds: float
    wait_seconds: float
    window_seconds: float
    samples: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerReport]
    done: float
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[str] = ..., timestamp: _Optional[float] = ..., num_workers: _Optional[int] = ..., batch_size: _Optional[int] = ..., samples_per_second: _Optional[float] = ..., idle_share: _Optional[float] = ..., step_seconds: _Optional[float] = ..., wait_seconds: _Optional[float] = ..., window_seconds: _Optional[float] = ..., samples: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerReport, _Mapping]]] = ..., done: _Optional[float] = ...) -> None: ...

class ReportSummary(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class WatchDirectivesRequest(_message.Message):
    __slots__ = ("job_id", "token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: str
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class Directive(_message.Message):
    __slots__ = ("job_id", "num_workers", "batch_size", "cpus", "reason", "revision", "remote_workers", "worker_nice", "tune_up_to", "remote_lent")
    class RemoteLentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REMOTE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKER_NICE_FIELD_NUMBER: _ClassVar[int]
    TUNE_UP_TO_FIELD_NUMBER: _ClassVar[int]
    REMOTE_LENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    num_workers: int
    batch_size: int
    cpus: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    revision: int
    remote_workers: int
    worker_nice: int
    tune_up_to: int
    remote_lent: _containers.ScalarMap[str, int]
    def __init__(self, job_id: _Optional[str] = ..., num_workers: _Optional[int] = ..., batch_size: _Optional[int] = ..., cpus: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., revision: _Optional[int] = ..., remote_workers: _Optional[int] = ..., worker_nice: _Optional[int] = ..., tune_up_to: _Optional[int] = ..., remote_lent: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DeregisterJobRequest(_message.Message):
    __slots__ = ("job_id", "token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: str
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class DeregisterJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "name", "limits", "pids", "num_workers", "batch_size", "samples_per_second", "idle_share", "accelerator_limit", "cpu_percent", "rss_bytes", "last_report_age_seconds", "directive", "done")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    IDLE_SHARE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    limits: JobLimits
    pids: _containers.RepeatedScalarFieldContainer[int]
    num_workers: int
    batch_size: int
    samples_per_second: float
    idle_share: float
    accelerator_limit: float
    cpu_percent: float
    rss_bytes: int
    last_report_age_seconds: float
    directive: Directive
    done: float
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., limits: _Optional[_Union[JobLimits, _Mapping]] = ..., pids: _Optional[_Iterable[int]] = ..., num_workers: _Optional[int] = ..., batch_size: _Optional[int] = ..., samples_per_second: _Optional[float] = ..., idle_share: _Optional[float] = ..., accelerator_limit: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., last_report_age_seconds: _Optional[float] = ..., directive: _Optional[_Union[Directive, _Mapping]] = ..., done: _Optional[float] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ...) -> None: ...

class GetNodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GpuStatus(_message.Message):
    __slots__ = ("index", "name", "utilization", "memory_used_bytes", "memory_total_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("hostname", "cpu_count", "cpu_percent", "disk_read_bytes_per_second", "disk_write_bytes_per_second", "nvml_available", "nvml_message", "gpus", "jobs", "policy", "sum_normalized_throughput", "cpu_enforcement")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DISK_READ_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITE_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    NVML_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    NVML_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SUM_NORMALIZED_THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    CPU_ENFORCEMENT_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    cpu_count: int
    cpu_percent: float
    disk_read_bytes_per_second: int
    disk_write_bytes_per_second: int
    nvml_available: bool
    nvml_message: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStatus]
    jobs: int
    policy: str
    sum_normalized_throughput: float
    cpu_enforcement: str
    def __init__(self, hostname: _Optional[str] = ..., cpu_count: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., disk_read_bytes_per_second: _Optional[int] = ..., disk_write_bytes_per_second: _Optional[int] = ..., nvml_available: _Optional[bool] = ..., nvml_message: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuStatus, _Mapping]]] = ..., jobs: _Optional[int] = ..., policy: _Optional[str] = ..., sum_normalized_throughput: _Optional[float] = ..., cpu_enforcement: _Optional[str] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyConfig(_message.Message):
    __slots__ = ("name", "worker_budget", "cpu_budget", "period_seconds", "memory_budget")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CPU_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    name: str
    worker_budget: int
    cpu_budget: int
    period_seconds: float
    memory_budget: float
    def __init__(self, name: _Optional[str] = ..., worker_budget: _Optional[int] = ..., cpu_budget: _Optional[int] = ..., period_seconds: _Optional[float] = ..., memory_budget: _Optional[float] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: PolicyConfig
    def __init__(self, config: _Optional[_Union[PolicyConfig, _Mapping]] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("num_workers", "cpus", "predicted_samples_per_second", "relative_std", "normalized", "chosen")
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_STD_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    num_workers: int
    cpus: int
    predicted_samples_per_second: float
    relative_std: float
    normalized: float
    chosen: bool
    def __init__(self, num_workers: _Optional[int] = ..., cpus: _Optional[int] = ..., predicted_samples_per_second: _Optional[float] = ..., relative_std: _Optional[float] = ..., normalized: _Optional[float] = ..., chosen: _Optional[bool] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("job_id", "policy", "reason", "accelerator_limit", "candidates", "worker_memory_bytes", "memory_budget_bytes", "memory_used_bytes", "memory_limited")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    WORKER_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMITED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    policy: str
    reason: str
    accelerator_limit: float
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    worker_memory_bytes: float
    memory_budget_bytes: float
    memory_used_bytes: float
    memory_limited: bool
    def __init__(self, job_id: _Optional[str] = ..., policy: _Optional[str] = ..., reason: _Optional[str] = ..., accelerator_limit: _Optional[float] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., worker_memory_bytes: _Optional[float] = ..., memory_budget_bytes: _Optional[float] = ..., memory_used_bytes: _Optional[float] = ..., memory_limited: _Optional[bool] = ...) -> None: ...
