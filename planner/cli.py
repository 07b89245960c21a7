"""`kernel-lab plan-blocks`: the state dtype a hybrid model gets and the unified block size.

    kernel-lab plan-blocks --model qwen3-next-80b-a3b --device cpu --state-dtype bfloat16 \
        --kv-dtype auto --tp 1

prints the decision, the reason, the byte arithmetic and a line ``block_size: N``. Bad input
(unreadable config, missing field, heads not divisible by tp, unknown dtype) prints one line and
exits with status 2. Also runs as ``python -m planner.cli plan-blocks ...``.
"""
from __future__ import annotations

import argparse
import sys

from planner import block_size, model_configs, state_dtype_policy

MiB = 1 << 20


def register(subparsers) -> None:
    """Add the ``plan-blocks`` command to an argparse subparsers object."""
    p = subparsers.add_parser("plan-blocks", help="state dtype policy and hybrid prefix-caching "
                              "block size for a model config")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", metavar="PATH", help="a Hugging Face config.json")
    src.add_argument("--model", choices=model_configs.model_names(), help="a shipped config")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--no-avx512-bf16", action="store_true",
                   help="the CPU lacks AVX-512 BF16 (default: it has it, as AMX CPUs do)")
    p.add_argument("--state-dtype", choices=state_dtype_policy.REQUESTS, default="auto",
                   help="requested --mamba-ssm-cache-dtype")
    p.add_argument("--kv-dtype", choices=block_size.KV_DTYPES, default="auto")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--spec-tokens", type=int, default=0,
                   help="speculative tokens (widen the conv state)")
    p.set_defaults(func=run)


def _platform(args) -> str:
    if args.device == "gpu":
        if args.no_avx512_bf16:
            raise ValueError("--no-avx512-bf16 describes a CPU: it needs --device cpu")
        return "gpu"
    return "cpu" if args.no_avx512_bf16 else "cpu-avx512bf16"


def report_lines(plan: block_size.BlockPlan, label: str) -> list[str]:
    """The plan as the lines `plan-blocks` prints."""
    d, s = plan.decision, plan.state
    outcome = "reset to float32" if d.reset else "kept"
    return [
        f"model: {label} ({plan.model_type}), tp={plan.tp}, platform={d.platform}",
        f"requested state dtype: {d.requested}",
        f"state dtype: {d.state_dtype} ({outcome}); conv state dtype: {d.conv_dtype}",
        f"reason: {d.reason}",
        f"attention KV per token per layer: {plan.kv_bytes_per_token} B (kv dtype {plan.kv_dtype})",
        f"state page per layer per sequence: {s.total_bytes} B = ssm {list(s.ssm_shape)} "
        f"{s.ssm_bytes} B + conv {list(s.conv_shape)} {s.conv_bytes} B",
        f"state memory per sequence: {plan.state_bytes_per_sequence / MiB:.2f} MiB, "
        f"{plan.padded_state_bytes_per_sequence / MiB:.2f} MiB in padded pages "
        f"({plan.num_recurrent_layers} {plan.recurrent_kind} layers, per rank)",
        f"block alignment: {plan.alignment} ({plan.alignment_source})",
        f"attention page: {plan.attention_page_bytes} B; state page padded by "
        f"{plan.state_padding_bytes} B",
        f"block_size: {plan.block_size}",
    ]


def run(args) -> int:
    try:
        if args.config:
            config, label = model_configs.read_config(args.config), args.config
        else:
            config, label = model_configs.shipped_config(args.model), args.model
        plan = block_size.plan_blocks(config, args.state_dtype, _platform(args), args.kv_dtype,
                                      args.tp, args.spec_tokens)
    except (ValueError, TypeError) as exc:
        sys.stderr.write(f"kernel-lab plan-blocks: error: {exc}\n")
        return 2
    print("\n".join(report_lines(plan, label)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
