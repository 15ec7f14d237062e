"""The HTTP serving pieces shared by the functions bind and mutate (functions/): gunicorn's
settings (gunicorn_config), draining on SIGTERM (draining), the fast path that answers the common
requests without Flask (fastpath), JSON log lines (jsonlog) and Knative's sink authentication
(sinkauth). The shells' helpers, kept apart from the pure core in gpu_scheduler/, which does no
I/O and no HTTP.
"""
