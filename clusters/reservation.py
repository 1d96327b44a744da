"""A pool's specific reservation: how GKE names it and what Terraform checks about it before apply.

Mirrors Google's cluster toolkit, ``modules/compute/gke-node-pool/reservation_definitions.tf``
(GoogleCloudPlatform/cluster-toolkit 1047080, 2026-06-25):

- ``reservation_affinity.values`` holds ``projects/<project>/reservations/<name>[/reservationBlocks/<b>]``;
  a bare name only matches a reservation in the node pool's own project, the full form also a
  shared one.
- a ``google_compute_reservation`` data source is read with the name only (never the block
  suffix), in the pool's zone, and a precondition on the node pool requires that it exists there,
  is ``specific_reservation_required = true`` (so nothing else eats it) and reserves the pool's
  machine type and accelerators.

Attribute names are those of hashicorp/terraform-provider-google v6.50.0,
``google/services/compute/resource_compute_reservation.go`` (the data source reuses that schema,
``data_source_google_compute_reservation.go``). A missing reservation does not fail the read: the
resource read turns the 404 into an empty ID (``transport.HandleNotFoundError``) and the data source
then sets its own ID, so every attribute reads empty. The precondition therefore tests content
(``specific_reservation`` present), as the toolkit does, never the read itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BLOCKS = "/reservationBlocks/"


@dataclass(frozen=True)
class ReservationSpec:
    project: str
    name: str
    block: str | None
    zone: str

    @property
    def affinity_value(self) -> str:
        """The value GKE matches against the ``compute.googleapis.com/reservation-name`` key."""
        suffix = f"{BLOCKS}{self.block}" if self.block else ""
        return f"projects/{self.project}/reservations/{self.name}{suffix}"


def derive_reservation(reservation: str, default_project: str, zone: str) -> ReservationSpec:
    """``name``, ``name/reservationBlocks/b`` or ``projects/p/reservations/name[/reservationBlocks/b]``
    (the file schema's RESERVATION pattern) -> its parts; the project defaults to the cluster's."""
    project = default_project
    rest = reservation
    if rest.startswith("projects/"):
        _, project, _, rest = rest.split("/", 3)
    name, _, block = rest.partition(BLOCKS)
    return ReservationSpec(project=project, name=name, block=block or None, zone=zone)


def precondition(ref: str, machine_type: str, accelerator: str, gpus: int, nodes: int) -> str:
    """The Terraform condition (without ``${}``) over the reservation at ``ref`` (a data source address
    such as ``data.google_compute_reservation.reservation_h100``, or a stand-in object in tests).

    ``nodes`` is the pool's largest size: a SPECIFIC_RESERVATION pool cannot grow outside its
    reservation, so a smaller reservation leaves Kueue admitting runs (quota is sized from the
    pool) that never get a node. ``specific_reservation.count`` is the reserved VM count
    (resource_compute_reservation.go v6.50.0). A reservation shared with other pools may still be
    short; that is beyond what one pool can see.

    The reservation's accelerator type may be a full or partial URL (the provider's description of
    ``accelerator_type``), so only its last path segment is compared.
    """
    props = f"try({ref}.specific_reservation[0].instance_properties[0], null)"
    accelerators = (f"{{ for acc in try({ref}.specific_reservation[0].instance_properties[0].guest_accelerators, []) :"
                    f" element(split(\"/\", acc.accelerator_type), length(split(\"/\", acc.accelerator_type)) - 1) => acc.accelerator_count }}")
    return (f"{props} != null && {ref}.specific_reservation_required == true"
            f" && try({ref}.specific_reservation[0].instance_properties[0].machine_type, \"\") == \"{machine_type}\""
            f" && jsonencode({accelerators}) == jsonencode({{ \"{accelerator}\" = {gpus} }})"
            f" && try({ref}.specific_reservation[0].count, 0) >= {nodes}")


def error_message(spec: ReservationSpec, machine_type: str, accelerator: str, gpus: int, nodes: int) -> str:
    return (f"Reservation {spec.name} in project {spec.project}, zone {spec.zone} must exist there, have"
            f" specific_reservation_required = true and reserve at least {nodes} x {machine_type} with {gpus} x {accelerator}"
            " (the node pool's shape and largest size); fix the reservation or the pool's reservation/zones/machine_type/max_nodes in the cluster file.")


def _shape() -> re.Pattern[str]:
    """The exact form ``precondition`` emits, with its literals limited to GCE name characters: the
    synthesis backstop (``stacks.interpolation``) allows this template and nothing looser."""
    text = re.escape(precondition("REF0", "MACHINE0", "ACCEL0", "GPUS0", "NODES0"))  # type: ignore[arg-type]
    for token, pattern in (("REF0", r"data\.google_compute_reservation\.[a-z0-9_]+"), ("MACHINE0", "[a-z0-9-]+"),
                           ("ACCEL0", "[a-z0-9-]+"), ("GPUS0", "[0-9]+"), ("NODES0", "[0-9]+")):
        text = text.replace(token, pattern)
    return re.compile(text)


PRECONDITION_SHAPE = _shape()
