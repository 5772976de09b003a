"""``ferry-controller``: stand for the Lease, and while leading keep the PeerSlices
(:mod:`.process`).  Logs to stderr (and ``--log-file``), never stdout.  Exits 1 when the lease is
lost (the Deployment restarts it), 0 on SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import socket
import sys

import click

from routesync.policy.peerslice import DELIVERIES, DELIVERY_LABELS, DELIVERY_SUBSCRIPTION, MAX_PODS, MAX_PODS_LIMIT

from .leader import elect


def _logging(log_file: str | None, verbose: bool) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


@click.command()
@click.option("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, else ~/.kube/config)")
@click.option("--lease-namespace", default="kube-system", show_default=True)
@click.option("--lease-name", default="ferry-controller", show_default=True)
@click.option("--identity", envvar="POD_NAME", default=None,
              help="this candidate's name in the Lease (default: $POD_NAME, else the host name and pid)")
@click.option("--max-pods", type=click.IntRange(1, MAX_PODS_LIMIT), default=MAX_PODS, show_default=True,
              help="Pods a PeerSlice holds at most: smaller, a Pod change rewrites less; larger, fewer objects")
@click.option("--delivery", type=click.Choice(DELIVERIES), default=DELIVERY_LABELS, show_default=True,
              help="how a slice reaches its Nodes: labelled with each Node of its audience, or by its group's "
                   "name, which each Node asks for (no write when the Nodes reading a group change; needs "
                   "route-sync of this version or later on every Node)")
@click.option("--log-file", default=None, help="log here too (stderr always)")
@click.option("-v", "--verbose", is_flag=True)
def main(kubeconfig: str | None, lease_namespace: str, lease_name: str, identity: str | None, max_pods: int,
         delivery: str, log_file: str | None, verbose: bool) -> None:
    """ferry-controller: publish to each Node the remote Pods its policy reads (PeerSlices)."""
    _logging(log_file, verbose)
    from routesync.sources.kube import api_client

    from .process import lead

    client = api_client(kubeconfig)
    me = identity or f"{socket.gethostname()}-{os.getpid()}"
    by_subscription = delivery == DELIVERY_SUBSCRIPTION
    logging.getLogger("controller").info("%s: delivery %s, at most %d Pods a slice", me, delivery, max_pods)
    sys.exit(elect(client, lease_namespace, lease_name, me,
                   lambda leading: lead(client, leading, max_pods=max_pods, by_subscription=by_subscription)))
