"""The scripted model providers a benchmark runs against, each in a process of its own.

``ProviderProcess`` (``bench_steps``) is one; ``ProviderProcesses`` starts several for a with
block and says what they cost: their base URLs, the CPU seconds they used (so a bench can say
what its figure is bounded by on a small machine), and the model calls they answered.
"""

from __future__ import annotations

from typing import Self

from tests.bench.bench_steps import ProviderProcess
from tests.bench.serve_process import cpu_seconds


class ProviderProcesses:
    """``count`` scripted providers answering ``plan`` (``tool_loop_script``), for a with block.

    Leaving the block kills any still running; ``stop`` first asks them to stop and counts the
    calls they answered.
    """

    def __init__(self, plan, count: int) -> None:
        self._plan = plan
        self._count = count
        self._started: list[ProviderProcess] = []
        self._calls: int | None = None
        self.base_urls: list[str] = []

    def __enter__(self) -> Self:
        try:
            for _ in range(self._count):
                provider = ProviderProcess(self._plan)
                self._started.append(provider.__enter__())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.base_urls = [provider.base_url for provider in self._started]
        return self

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the providers have used so far."""
        return sum(cpu_seconds(provider.pid) for provider in self._started)

    def stop(self) -> int:
        """Stop every provider (once); the model calls they answered together."""
        if self._calls is None:
            self._calls = sum(provider.stop() for provider in self._started)
        return self._calls

    def __exit__(self, *exc_info) -> None:
        for provider in self._started:
            provider.__exit__(*exc_info)
