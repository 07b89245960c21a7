"""Peer implementations (the kernels people deploy, imported from their installed packages, never
copied): one module per peer package, discovered by ``bench.registry.load``. Each registers its
``Impl``s with ``role="peer"`` on the benches it implements, with ``available()`` saying why not
(package not installed, op missing, version) and ``supports(shape)`` for shapes it refuses. A peer
whose preparation or first call raises is recorded as skipped with the exception, not a crash of
the run; its gates then skip with that reason. Example, in ``bench/peers/mypeer.py``::

    from bench.registry import Impl, register_impl

    def _available():
        try:
            import mypeer
        except ImportError as exc:
            return False, f"mypeer is not importable ({exc})"
        return True, f"mypeer {mypeer.__version__}"

    def _decode(shape, inputs):            # inputs: bench.gdn_cpu.decode_inputs(shape)
        import mypeer
        ...                                # convert once here, not in the timed call
        return lambda: mypeer.decode(...)

    register_impl(Impl(bench="gdn/decode", name="mypeer", role="peer", prepare=_decode,
                       available=_available))

The gates naming a peer (``bench/gates.toml``: ``vllm-cpu`` on gdn/decode, ``vllm-triton`` on
turboquant/decode) skip until a module here registers that name.
"""
