"""``svcframe topology``: packages, NUMA nodes, cores and NICs as the plumber sees them, and what every plumber
policy pair would choose."""

from __future__ import annotations

import click

from ..errors import SvcframeError
from ..topology import BACKENDS
from .common import echo_json, fail, output_console, print_lines, print_table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the topology document (the --from FILE format).")
@click.option("--from", "from_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A described topology (JSON, or hwloc XML through pyhwloc) instead of this host's.")  # fmt: skip
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True)
@click.option("--policies", is_flag=True, help="Also show what every plumber policy pair would choose (dry run).")
@click.option("--interfaces", multiple=True, help="Interface-name pattern the plumber may choose (repeatable).")
def topology(as_json: bool, from_file: str | None, backend: str, policies: bool, interfaces: tuple[str, ...]) -> None:
    """Show packages, NUMA nodes, cores and NICs (with PCI locality), as the plumber sees them."""
    from ..plumber import BUCKET_POLICIES, NIC_POLICIES, select_nic
    from ..topology import discover, format_cpulist, load_topology

    try:
        topo = load_topology(from_file) if from_file else discover(backend)
    except SvcframeError as exc:
        fail(str(exc))
    patterns = list(interfaces) or None
    matrix = []
    if policies:  # every pair of policies that choose (passthrough, a None in the registries, does not)
        for bp in (b for b, choose_buckets in BUCKET_POLICIES.items() if choose_buckets is not None):
            for np_ in (n for n, choose_nic in NIC_POLICIES.items() if choose_nic is not None):
                choice = select_nic(topo, bp, np_, interfaces=patterns, dry_run=True)
                matrix.append({"bucket_policy": bp, "nic_policy": np_, **choice.to_dict()})
    if as_json:
        echo_json({**topo.to_dict(), **({"policies": matrix} if policies else {})})
        return
    console = output_console()
    print_lines(
        f"{topo.host or '(described)'} from {topo.source}: {len(topo.packages)} package(s), "
        f"{len(topo.numa_nodes)} NUMA node(s), {len(topo.cores)} core(s), {len(topo.cpus)} CPU(s)",
        console=console,
    )
    places = [("package", p.os_index, format_cpulist(p.cpus)) for p in topo.packages]
    places += [("numa", node.os_index, format_cpulist(node.cpus)) for node in topo.numa_nodes]
    print_table(("kind", "os_index", "cpus"), places, title="packages and NUMA nodes", console=console)
    candidates = {n.name for n in topo.candidate_nics(patterns)}
    nics = []
    for n in topo.nics:
        pkgs = sorted({p.os_index for p in topo.packages if p.cpus & n.local_cpus})
        nics.append((
            n.name, ", ".join(n.addresses) or "-", format_cpulist(n.local_cpus), ",".join(map(str, pkgs)),
            n.numa_node, n.pci or "-", "virtual" if n.virtual else "pci", "yes" if n.up else "no",
            "yes" if n.name in candidates else "no",
        ))  # fmt: skip
    print_table(("name", "addresses", "cpus", "package", "numa", "pci", "kind", "up", "plumber"), nics,
                title="network interfaces (cpus: local CPUs; plumber: a candidate of the plumber)",
                console=console)  # fmt: skip
    if matrix:
        rows = [(r["bucket_policy"], r["nic_policy"], r["bucket"], r["nic"], r["address"]) for r in matrix]
        title = "plumber choices for this process (dry run: round robin not taken)"
        print_table(("bucket_policy", "nic_policy", "bucket", "nic", "address"), rows, title=title, console=console)
