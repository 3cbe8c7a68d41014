"""The seed's 92c job file, as the A9 box ran it: the runner must read it, and plans/a9.yaml must render it."""

from __future__ import annotations

SEED_92C = """# LANE=net
# REQUIRES=test -f /home/user/work/a9-agent-bench/agent-playground/bench/a9-results/matrix/.done-s2-fnmtpcx-flashnext-iq4xs
# DONE_IF=test -f /home/user/models/MAI-Code-1.1-Flash-On-Device/.ok
# RETRIES=3
bash /home/user/work/a9-agent-bench/agent-playground/bench/fetch-azureml.sh azureml://registries/azureml/models/MAI-Code-1.1-Flash-On-Device/versions/1 /home/user/models/MAI-Code-1.1-Flash-On-Device
"""
