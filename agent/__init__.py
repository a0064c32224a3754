"""The node agent (`llmgw agent`): observes one node and reports it.

gpus.py           GPUs through NVML (the only module that imports pynvml); fake GPUs
fabric.py         fabric names: configured, or the InfiniBand subnet prefix from sysfs
mounts.py         /proc/self/mountinfo: which mount holds a directory, shared or local
weights.py        is a model directory complete (safetensors headers, GGUF, downloads)
storage.py        model discovery in the configured directories (plain and HF cache)
storage_watch.py  storage scans in worker threads, so a hung filer cannot stop reports
report.py         one NodeReport from all of the above
loop.py           report, hand assignments to the engines, back off when the controller is away
cli.py            `llmgw agent` options; `--once --json` prints one report
sample_models.py  small valid model directories (demo, tests, bench)
engines.py        the engine supervisor (runs what the controller assigns), composing:
engine_settings.py  its settings, built once from the flags
engine_lifecycle.py start, stop, exits, kills, adopt, the state file (engine_state.py)
engine_probes.py    health, ready, stall, hung, the /metrics scrape: verdicts, no actions
engine_sleep.py     sleep and wake
engine_http.py      the one HTTP session to the engines
engine_shard.py     one engine as the supervisor sees it
"""
