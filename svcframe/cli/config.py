"""``svcframe config``: check a bootstrap config offline, print its JSON Schema, and read or patch the live
configuration of running servers (JMESPath queries, JSON Patch)."""

from __future__ import annotations

import json

import click

from ..composition import check_document, service_schema
from ..config import read_document
from ..errors import SvcframeError
from ..provider import installed_libraries
from .common import (
    addresses_then,
    echo_json,
    fail,
    import_from_cwd,
    json_argument,
    output_path,
    resolve_targets,
    run_admin,
    target_options,
    write_output,
)


@click.group()
def config() -> None:
    """Check, export the schema of, and read live configurations."""


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--procs", "-n", type=click.IntRange(min=1), default=1, show_default=True,
              help="Check it as `svcframe launch --procs N` starts it: N processes in one directory.")  # fmt: skip
def config_check(file: str, procs: int) -> None:
    """Check a bootstrap config offline as `svcframe serve` does before it starts anything: the sections,
    the libraries (imported, from the current directory first), each provider's type, id, config (by its
    type's Config model) and dependencies (names, types, local ones listed before).

    Prints the config with every default filled in, provider configs and chosen ids included. Every problem is
    found in one pass (an invalid section does not hide the providers' problems), each one line on stderr
    naming its JSON path in FILE (exit 1); a dependency on another server is noted on stderr, not checked.
    Mochi's margo/bedrock sections are read as engine/admin (one warning names what is ignored).
    """
    import_from_cwd()
    try:
        data = read_document(file)
    except SvcframeError as exc:
        fail(str(exc))
    cfg, checked, findings = check_document(data, file, procs=procs)
    for note in findings.notes:
        click.echo(f"svcframe: note: {note}", err=True)
    if findings.problems or cfg is None:
        fail("\n".join(findings.problems))
    document = cfg.model_dump(mode="json")
    document["providers"] = [
        {**c.spec.model_dump(mode="json"), "config": c.settings.model_dump(mode="json")} for c in checked
    ]
    echo_json(document)


@config.command("schema")
@click.option("--library", "-l", "libraries", multiple=True, metavar="MODULE",
              help="Describe the provider types of this library (repeatable). Default: the installed ones "
              "(entry-point group svcframe.providers: svcframe's kv, blob and selftest).")  # fmt: skip
@click.option("--output", "-o", callback=output_path, type=click.Path(dir_okay=False), default=None,
              help="Write it to this file (the repository keeps it in configs/schema.json).")  # fmt: skip
def config_schema_cmd(libraries: tuple[str, ...], output: str | None) -> None:
    """Print the JSON Schema of the bootstrap config (from the pydantic models): each providers[] entry is a
    union discriminated on `type`, with that type's Config, so an editor checks a provider's config by type."""
    import_from_cwd()
    try:
        schema = service_schema(libraries or installed_libraries())
    except SvcframeError as exc:
        fail(str(exc))
    if output:
        write_output(output, json.dumps(schema, indent=2) + "\n", "the schema")
        click.echo(f"schema written to {output}", err=True)
    else:
        echo_json(schema)


@config.command("get")
@target_options
@click.option("--output", "-o", callback=output_path, type=click.Path(dir_okay=False), default=None,
              help="Write the one server's configuration to this file, ready for `svcframe serve`.")  # fmt: skip
def config_get(address: tuple[str, ...], group: str | None, ranks: list[int] | None, output: str | None) -> None:
    """Print the live configuration of each server, keyed by address (re-launchable: defaults filled in,
    every change since start, the configured listen address; the bound one is in `svcframe status`)."""
    targets = resolve_targets(address, group, ranks)
    if output and len(targets) != 1:
        fail(f"--output takes the configuration of one server; {len(targets)} were given")
    configs = run_admin(targets, "get_config")
    if output:
        write_output(output, json.dumps(next(iter(configs.values())), indent=2) + "\n", "the configuration")
        click.echo(f"configuration of {targets[0][0]} written to {output}", err=True)
    else:
        echo_json(configs)


@config.command("query")
@addresses_then("EXPRESSION")
def config_query(args: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Evaluate a JMESPath EXPRESSION on each server's live configuration."""
    *addresses, expression = args
    echo_json(run_admin(resolve_targets(tuple(addresses), group, ranks), "query_config", expression))


@config.command("patch")
@addresses_then("PATCH")
def config_patch(args: tuple[str, ...], group: str | None, ranks: list[int] | None) -> None:
    """Apply a JSON PATCH (JSON text or @FILE) to each server's live configuration.

    Example: svcframe config patch ADDRESS '[{"op": "replace", "path": "/engine/progress_mode", "value": "busy"}]'
    """
    *addresses, text = args
    patch = json_argument(text, "the JSON Patch")
    echo_json(run_admin(resolve_targets(tuple(addresses), group, ranks), "patch_config", patch))
