"""Counting the pool's worker starts in a test."""
from conformance.run import workers


def count_worker_starts(monkeypatch) -> list[dict]:
    """Makes every ``workers.Worker`` started from now on append its environment to the returned list."""
    starts: list[dict] = []

    class Counted(workers.Worker):
        def __init__(self, env):
            starts.append(env)
            super().__init__(env)

    monkeypatch.setattr(workers, "Worker", Counted)
    return starts
