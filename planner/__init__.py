"""State-dtype policy and hybrid prefix-caching block-size planner.

- `planner.model_configs`: a Hugging Face config.json dict -> validated `ModelConfig`; shipped
  configs in ``planner/configs/``.
- `planner.state_dtype_policy`: `decide_state_dtype` (kept low-precision state or float32, and why).
- `planner.block_size`: per-token KV bytes, the state page, `plan_blocks` (the unified block size).
- `planner.cli`: the ``kernel-lab plan-blocks`` command.
"""
