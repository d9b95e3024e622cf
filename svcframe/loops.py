"""Event-loop factories, by name: the registry the config and the CLI choose from.

``uvloop`` is the default where it imports; ``asyncio`` is the standard library's selector loop.
Loops are created through factories (``asyncio.Runner(loop_factory=...)``), never installed globally.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop_factory() -> asyncio.AbstractEventLoop:
    import uvloop

    return uvloop.new_event_loop()


def _have_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": _uvloop_factory,
    "asyncio": asyncio.new_event_loop,
}
#: The names a config or a command may choose: ``auto`` (uvloop when it imports, else asyncio), then the factories.
EVENT_LOOPS = ("auto", *LOOP_FACTORIES)


def loop_factory(name: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """The factory for ``name`` (``auto`` = uvloop when importable, else asyncio).

    Raises:
        ValueError: unknown name, or uvloop requested but not installed.
    """
    if name == "auto":
        name = "uvloop" if _have_uvloop() else "asyncio"
    if name == "uvloop" and not _have_uvloop():
        raise ValueError("event_loop 'uvloop' requested but uvloop is not installed (pip install uvloop)")
    try:
        return LOOP_FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown event_loop {name!r}; choose one of {list(EVENT_LOOPS)}") from None


def run(main: Coroutine[Any, Any, T], event_loop: str = "auto") -> T:
    """Run ``main`` to completion on a new loop of the named kind."""
    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        return runner.run(main)
