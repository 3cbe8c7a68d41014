"""The A9's model intakes as a Python plan: the roster is a typed model, so a launch flag the llama.cpp
router presets cannot take (the seed's `-b 2048`, which failed every intake's smoke gate for 17 hours)
is a compile error at the roster line, not three failed intakes that each look like the model's fault.

    plan check plans/a9_intakes.py
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from plancompiler.models import Job, Plan

# The router preset script takes long flags, and of the short ones only these two.
ROUTER_SHORT_FLAGS = {"-ctk", "-ctv"}

HOME = "/home/user"
BENCH = f"{HOME}/work/a9-agent-bench/agent-playground/bench"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    repo: str
    file: str
    chat_template: str
    ctx: int = 65536
    port: int
    serve_args: list[str] = []

    @field_validator("serve_args")
    @classmethod
    def _router_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            if arg.startswith("-") and not arg.startswith("--") and arg not in ROUTER_SHORT_FLAGS:
                raise ValueError(f"unsupported sampler flag: {arg} (the router presets take "
                                 f"{', '.join(sorted(ROUTER_SHORT_FLAGS))} and long flags)")
        return args

    @field_validator("port")
    @classmethod
    def _port(cls, port: int) -> int:
        if not 1024 < port < 65536:
            raise ValueError(f"port {port} is not a user port")
        return port


ROSTER = [
    Model(name="qwen36-35b-q8kxl", repo="unsloth/Qwen3.6-35B-A3B-GGUF", file="Qwen3.6-35B-A3B-UD-Q8_K_XL.gguf",
          chat_template="qwen36-35b.jinja", ctx=131072, port=45541, serve_args=["-ctk", "q8_0", "-ctv", "q8_0"]),
    Model(name="kimi-linear-q8", repo="moonshotai/Kimi-Linear-48B-A3B-Instruct-GGUF",
          file="Kimi-Linear-48B-A3B-Instruct-Q8_0.gguf", chat_template="kimi-linear.jinja", port=45544),
    Model(name="mai-code-1.1-flash", repo="microsoft/MAI-Code-1.1-Flash-GGUF", file="model.gguf",
          chat_template="mai-code.jinja", port=45546, serve_args=["--batch-size", "2048", "--ubatch-size", "2048"]),
]


def _jobs(model: Model) -> list[Job]:
    dest = f"{HOME}/models/{model.name}"
    gate = f"{BENCH}/a9-results/intake/gate-{model.name}.json"
    return [
        Job(name=f"60-net-fetch-{model.name}", lane="net", template="fetch-hf.sh.j2",
            with_={"repo": model.repo, "files": [model.file], "dest": dest},
            outputs=[f"{dest}/.ok"], retries=3, timeout="8h"),
        Job(name=f"65-gpu-intake-z-{model.name}", lane="gpu", template="intake.sh.j2",
            with_={"model": model.name, "gguf": f"{dest}/{model.file}", "port": model.port, "ctx": model.ctx,
                   "chat_template": f"{HOME}/work/a9-agent-bench/launch/templates/{model.chat_template}",
                   "serve_args": list(model.serve_args), "gate": gate},
            requires=[{"after": f"60-net-fetch-{model.name}"}], outputs=[{"nonempty": gate}], timeout="3h"),
    ]


plan = Plan(
    plan="a9-intakes",
    vars={"bench": BENCH, "res": f"{BENCH}/a9-results",
          "llama_server": f"{HOME}/tools/llamacpp-vulkan-master/llama-server",
          "clients": ["opencode", "pi", "claude-code"]},
    external=[f"{BENCH}/intake/", f"{HOME}/tools/llamacpp-vulkan-master/llama-server",
              f"{HOME}/work/a9-agent-bench/launch/templates/"],
    jobs=[job for model in ROSTER for job in _jobs(model)],
)
