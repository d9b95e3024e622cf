"""``svcframe call``: call any RPC of any provider and print its result as JSON, every value as it is (bytes as
text when they are UTF-8 text, else ``base64:DATA`` or ``hex:DATA``, the forms ARG reads back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import SvcframeError
from ..registration import MAX_PROVIDER_ID
from .common import describe, fail, group_members, group_option, read_secret

#: How ``svcframe call`` prints bytes in a result (``--bytes-as``): ``auto`` as text when they are UTF-8 without
#: control characters (a kv key, a text value), else ``base64:DATA``; ``base64`` and ``hex`` always so, in the form
#: ARG reads back (``base64:DATA``, ``hex:DATA``).
BYTES_AS = ("auto", "base64", "hex")


def _call_argument(text: str) -> Any:
    """ARG of ``svcframe call``: JSON, ``@FILE`` (the file's bytes), ``base64:DATA`` or ``hex:DATA`` (bytes)."""
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_bytes()
        except OSError as exc:
            fail(f"ARG {text}: cannot read {text[1:]}: {exc.strerror}", 2)
    if text.startswith("base64:"):
        import base64
        import binascii

        try:
            return base64.b64decode(text[7:], validate=True)
        except binascii.Error as exc:
            fail(f"ARG {text[:40]}: not base64 ({exc})", 2)
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError as exc:
            fail(f"ARG {text[:40]}: not hex ({exc})", 2)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(
            f"ARG {text[:40]!r} is not JSON ({exc.msg} at column {exc.colno}); quote strings as '\"text\"', "
            "pass bytes as @FILE, base64:DATA or hex:DATA",
            2,
        )


def _is_text(data: bytes) -> bool:
    """UTF-8 with no control character but tab and newline: bytes that print as what they are."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c in "\t\n" or (c.isprintable() and c != "\x7f") for c in text)


def shown(value: Any, bytes_as: str = "auto") -> Any:
    """A result as JSON shows it, every value as it is: bytes (anywhere, map keys included) as text when
    ``bytes_as`` is ``auto`` and they are UTF-8 text (:func:`_is_text`), else as ``base64:DATA`` or ``hex:DATA``
    (what ARG reads back); lists, maps and scalars as themselves."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if bytes_as == "auto" and _is_text(data):
            return data.decode("utf-8")
        if bytes_as == "hex":
            return "hex:" + data.hex()
        import base64

        return "base64:" + base64.b64encode(data).decode("ascii")
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else str(shown(k, bytes_as))): shown(v, bytes_as) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown(v, bytes_as) for v in value]
    return value


@click.command()
@click.argument("words", nargs=-1, required=True, metavar="[ADDRESS] RPC_NAME [ARG]")
@group_option
@click.option("--rank", type=int, default=0, show_default=True, help="Which member of the group to call.")
@click.option("--bytes", "byte_fields", multiple=True, metavar="FIELD=@FILE|base64:DATA",
              help="Set FIELD of the JSON object ARG to bytes (repeatable), e.g. --bytes value=@blob.bin.")  # fmt: skip
@click.option("--provider-id", "-p", type=click.IntRange(0, MAX_PROVIDER_ID), default=0, show_default=True)
@click.option("--timeout-seconds", type=float, default=10.0, show_default=True)
@click.option("--bytes-as", type=click.Choice(BYTES_AS), default="auto", show_default=True,
              help="How bytes in the result print: auto = text when they are UTF-8 text, else base64:DATA; "
              "base64 or hex always (as ARG reads them back).")  # fmt: skip
def call(
    words: tuple[str, ...], group: str | None, rank: int, byte_fields: tuple[str, ...], provider_id: int,
    timeout_seconds: float, bytes_as: str,
) -> None:  # fmt: skip
    """Call RPC_NAME of a provider and print the result as JSON, every value as it is: bytes as text when they are
    UTF-8 text (a key), else as base64:DATA (--bytes-as base64|hex: always so).

    The server is ADDRESS (tcp://... or unix://...), else the member --rank of the group file -g (or
    $SVCFRAME_GROUP). ARG is JSON (default null), @FILE (the file's bytes), base64:DATA or hex:DATA (bytes). With
    --bytes, ARG is a JSON object some of whose fields are bytes: svcframe call ADDR put '{"key": "k"}' --bytes
    value=@v.bin -p 1
    """
    from ..engine import Engine
    from ..loops import run

    if "://" in words[0]:  # an address: tcp://HOST:PORT or unix:///path
        if group is not None:
            fail("give ADDRESS or -g/--group, not both", 2)
        if len(words) not in (2, 3):
            fail("usage: svcframe call ADDRESS RPC_NAME [ARG], or svcframe call -g GROUP RPC_NAME [ARG]", 2)
        address, rpc_name, *rest = words
    else:
        if len(words) > 2:
            fail(f"{words[0]!r} is not an address (tcp://... or unix://...): give ADDRESS RPC_NAME [ARG]", 2)
        (member,) = group_members(group, [rank])
        address = member.address
        rpc_name, *rest = words
    arg = _call_argument(rest[0] if rest else ("{}" if byte_fields else "null"))
    for spec in byte_fields:
        name, sep, source = spec.partition("=")
        if not sep or not source.startswith(("@", "base64:", "hex:")):
            fail(f"--bytes {spec}: expected FIELD=@FILE, FIELD=base64:DATA or FIELD=hex:DATA", 2)
        if not isinstance(arg, dict):
            fail("--bytes needs ARG to be a JSON object", 2)
        arg[name] = _call_argument(source)

    async def go() -> Any:
        async with Engine(None, secret=read_secret()) as engine:
            return await engine.call(address, rpc_name, arg, provider_id=provider_id, timeout_seconds=timeout_seconds)

    try:
        result = run(go())
    except (SvcframeError, ValueError) as exc:
        fail(describe(exc))
    click.echo(json.dumps(shown(result, bytes_as), indent=2, ensure_ascii=False, default=str))  # é, not \u00e9
