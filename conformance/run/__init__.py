"""The run engine: a selection of (cell, backend) pairs planned, executed (this machine's worker pool or
a Ray cluster's slots), recorded one JSON record a pair into a run folder, and merged across shards.

Entry point ``runner.run``. Layers inside, lowest first: ``schema``, ``records``,
``spawn``, ``progress``, ``counts``; ``estimate``, ``probe``, ``inprocess``, ``selection``; ``workers``,
``node_report``, ``remote``, ``slot_host``, ``ray_executor``; ``run_folder``, ``merge``, ``executors``,
``runner``.
"""
