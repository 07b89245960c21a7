"""One progress line on a stream: ``[####................] 12/45  26% <text>``, redrawn in place on a
terminal, and a new line every 5% (and at the end) when the stream is a file or a pipe."""
from __future__ import annotations


class ProgressLine:
    def __init__(self, total: int, stream):
        self.total, self.stream = max(total, 1), stream
        self.tty = stream.isatty()
        self._last_step = -1
        self._open = False

    def show(self, done: int, text: str) -> None:
        pct = int(100 * min(done, self.total) / self.total)
        bar = "#" * (pct // 5) + "." * (20 - pct // 5)
        line = f"[{bar}] {done}/{self.total} {pct:3d}% {text}"
        if self.tty:
            self.stream.write("\r" + line.ljust(100))
            self._open = done < self.total
            if not self._open:
                self.stream.write("\n")
        elif pct // 5 != self._last_step or done >= self.total:
            self.stream.write(line + "\n")
        self._last_step = pct // 5
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False
