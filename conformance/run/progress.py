"""One progress line on a stream: ``[####................]  26% <text>``, redrawn in place on a
terminal (cut to its width, so it stays one line), and a new line every 5% or ``EVERY_S`` seconds
(and at the end) when the stream is a file or a pipe.

The bar measures work in any unit the caller advances it by: ``conform`` by the estimated seconds
of each finished pair (a skip weighs nothing, so skips written first do not move it), ``bench`` by
timed calls. ``refresh`` redraws it with new text and no work added (``conform`` every few seconds
while a pair runs): on a terminal in place, on a file or a pipe at most one line per ``EVERY_S``."""
from __future__ import annotations

import shutil
import time


class Progress:
    EVERY_S = 30.0

    def __init__(self, total: float, stream):
        self.total, self.stream = max(float(total), 1e-9), stream
        self.done = 0.0
        self.tty = stream.isatty()
        self._last_step = -1
        self._open = False
        self._finished = False
        self._last_time = time.monotonic()

    def advance(self, amount: float, text: str, finished: bool = False) -> None:
        """Add ``amount`` to the work done and redraw with ``text``; ``finished``: the last update."""
        self.done += amount
        pct = int(100 * min(self.done, self.total) / self.total)
        if finished:
            pct = 100
        elif pct == 100:
            pct = 99   # the estimate ran short: not done until the last record
        bar = "#" * (pct // 5) + "." * (20 - pct // 5)
        line = f"[{bar}] {pct:3d}% {text}"
        if self.tty:
            width = max(20, shutil.get_terminal_size((101, 24)).columns - 1)
            self.stream.write("\r" + line[:width].ljust(width))
            self._open = not finished
            if finished:
                self.stream.write("\n")
        elif pct // 5 != self._last_step or finished or time.monotonic() - self._last_time >= self.EVERY_S:
            self.stream.write(line + "\n")
            self._last_time = time.monotonic()
        self._last_step = pct // 5
        self._finished = self._finished or finished
        self.stream.flush()

    def grow(self, total: float) -> None:
        """The work is now ``total`` (more joined it): the bar is not finished until a last update again."""
        self.total, self._finished = max(float(total), 1e-9), False

    def refresh(self, text: str) -> None:
        """Redraw with ``text`` and no work added; nothing after the last update."""
        if not self._finished:
            self.advance(0.0, text)

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False
