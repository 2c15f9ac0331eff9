"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def until(check: Callable[[], bool | Awaitable[bool]], within: float = 30.0) -> None:
    """Wait until ``check()`` is true (it may be async); fail after ``within`` seconds."""

    async def poll() -> None:
        while True:
            outcome = check()
            if await outcome if inspect.isawaitable(outcome) else outcome:
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), within)
