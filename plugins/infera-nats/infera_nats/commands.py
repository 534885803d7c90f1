"""``infera-run nats-layout``: write an authenticated NATS plane's server configuration and
every role's password (for ``deploy/``: a nats-server config and Kubernetes secrets).

The layout is :mod:`infera_core.util.nats_layout`'s (the one ``infera-run up`` runs its own
nats-server with): users ``admin``, ``router`` and ``worker-<id>`` per worker, fresh random
passwords. It writes into ``--out``:

* ``nats.conf`` — the server configuration (JetStream, the users and their permissions);
* ``router``, ``admin`` and ``workers/<worker id>`` — each user's password, one file each
  (``--nats-password-file``), and prints the ``kubectl`` lines that make the secrets the
  manifests under ``deploy/kubernetes/components/nats-plane`` mount.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from infera_core.util.nats_layout import DEFAULT_BUCKET, DEFAULT_PREFIX, Layout, Plane, server_config


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


@click.command("nats-layout")
@click.option(
    "--worker-id", "worker_id", multiple=True, required=True, help="A worker's id (repeat per worker)."
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Output folder.")
@click.option(
    "--nats-subject-prefix", default=DEFAULT_PREFIX, show_default=True, help="As the plane's processes use."
)
@click.option(
    "--nats-bucket", default=DEFAULT_BUCKET, show_default=True, help="As the plane's processes use."
)
@click.option("--host", default="0.0.0.0", show_default=True, help="The address nats-server listens on.")
@click.option("--port", default=4222, show_default=True, help="Its client port.")
def nats_layout(
    worker_id: tuple[str, ...], out: Path, nats_subject_prefix: str, nats_bucket: str, host: str, port: int
) -> None:
    """Write an authenticated NATS plane: nats-server's config and each role's password."""
    workers = list(worker_id)
    if len(set(workers)) != len(workers):
        raise click.UsageError("a --worker-id is given twice")
    layout = Layout.generate(workers, Plane(prefix=nats_subject_prefix, bucket=nats_bucket))
    try:
        (out / "workers").mkdir(parents=True, exist_ok=True)
        _private(out / "nats.conf", server_config(layout, host=host, port=port))
        for user in ("admin", "router"):
            _private(out / user, layout.credentials(user).password)
        for wid in workers:
            _private(out / "workers" / wid, layout.worker(wid).password)
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc.strerror}") from None
    click.echo(
        f"wrote {out}/nats.conf, {out}/router, {out}/admin and {len(workers)} file(s) in {out}/workers/"
    )
    click.echo("Kubernetes (deploy/kubernetes/components/nats-plane):")
    click.echo(f"  kubectl create secret generic infera-nats-server --from-file=nats.conf={out}/nats.conf")
    click.echo(f"  kubectl create secret generic infera-nats-router --from-file=router={out}/router")
    click.echo(f"  kubectl create secret generic infera-nats-workers --from-file={out}/workers/")
