"""bind's Prometheus metrics, named in kube-scheduler's style (`scheduler_schedule_attempts_total`,
`scheduler_scheduling_attempt_duration_seconds`, `scheduler_pending_pods`) under the
`gpu_scheduler_` prefix. Every label takes values from a fixed set, so no sender can grow them;
`node` and `device` come from the API server's own objects (a cluster's GPUs)."""
import prometheus_client as prom

# One placement attempt of one pod: scheduled (bound), unschedulable (a filter refused it, or the
# map cannot place it), error (the API failed; the pod is retried with backoff).
SCHEDULE_ATTEMPTS = prom.Counter("gpu_scheduler_schedule_attempts_total",
                                 "Placement attempts by result: scheduled, unschedulable, error", ["result"])
ATTEMPT_DURATION = prom.Histogram("gpu_scheduler_scheduling_attempt_duration_seconds",
                                  "Time of one placement attempt, API calls included", ["result"],
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
# bind's scheduling queue, as kube-scheduler's scheduler_pending_pods{queue}.
PENDING_PODS = prom.Gauge("gpu_scheduler_pending_pods",
                          "Pods of ours waiting in bind's queue: active, backoff, unschedulable", ["queue"])
# The device records (one Lease per node and device) this instance sees: 1 while a workload holds
# the device. Every instance reports the same records: aggregate with max by (node, device).
GPUS_HELD = prom.Gauge("gpu_scheduler_gpus_held", "Devices held by a workload, from the device records",
                       ["node", "device"])
# Preemption (gpu_scheduler/plugins/defaultpreemption.py): each PostFilter run by what it came to
# (Preempted, None: nobody can be, Waiting: victims terminating, Lost: another preemptor or instance
# claimed first, Error), and each pod evicted.
PREEMPTION_ATTEMPTS = prom.Counter("gpu_scheduler_preemption_attempts_total",
                                   "Preemption attempts by result: Preempted, None, Waiting, Lost, Error", ["result"])
PREEMPTION_VICTIMS = prom.Counter("gpu_scheduler_preemption_victims_total", "Pods evicted by preemption")
