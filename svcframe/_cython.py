"""What svcframe's compiled modules read of ``cython`` when they run interpreted where Cython is not installed.

A module written for Cython's pure-Python mode imports ``cython``; compiled, Cython itself answers, and where
Cython is installed its own module does. Without Cython, this one does: ``cython.compiled`` is False, so the
branches written for the compiled build (``if cython.compiled:``) are never taken, and its directives are
decorators that change nothing.
"""

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

compiled = False


def annotation_typing(enabled: bool) -> Callable[[F], F]:
    """Cython's directive: compiled, a function's annotations are its C types; here, nothing."""
    return lambda function: function
