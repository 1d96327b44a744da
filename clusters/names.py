"""Name and charset rules of the APIs gpufleet's names end up in, as pure predicates with one-line reasons.

A cluster file can pass its own schema and still derive a name the target API refuses at apply
time (a 67-character MIG name, a label value with a space). Each rule here returns ``None`` when
the value is accepted, else the reason in words (what is allowed), so a check can add the fix.

Sources (the rules, not copied text):
- Compute Engine resource names: RFC 1035 labels, ``[a-z]([-a-z0-9]*[a-z0-9])?``, at most 63
  characters (cloud.google.com/compute/docs/naming-resources).
- Labels: keys and values at most 63 characters; lowercase letters, digits, ``_`` and ``-``; keys
  start with a letter (cloud.google.com/compute/docs/labeling-resources). Kubernetes label
  values (GKE node labels) must also begin and end with an alphanumeric character
  (kubernetes.io/docs/concepts/overview/working-with-objects/labels); gpufleet applies both.
- Service account ids: 6-30 characters, ``[a-z]([-a-z0-9]*[a-z0-9])`` (IAM
  projects.serviceAccounts.create, ``accountId``).
- Cloud Storage buckets: 3-63 characters (222 with dots, each dot-separated part <= 63),
  lowercase letters, digits, ``-``, ``_``, ``.``; start and end with a letter or digit; not an
  IP address; not starting with ``goog``; no ``google`` (cloud.google.com/storage/docs/buckets#naming).
- DNS: each label at most 63 characters, the whole name at most 253 (RFC 1035 section 2.3.4).
"""

from __future__ import annotations

import ipaddress
import re

GCE_NAME_MAX = 63
LABEL_MAX = 63
ACCOUNT_ID_MIN, ACCOUNT_ID_MAX = 6, 30
BUCKET_MIN, BUCKET_MAX, BUCKET_DOTTED_MAX = 3, 63, 222
DNS_LABEL_MAX, DNS_NAME_MAX = 63, 253

_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?)?$")
_ACCOUNT_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")
_BUCKET = re.compile(r"^[a-z0-9]([-_.a-z0-9]*[a-z0-9])?$")


def gce_name(name: str) -> str | None:
    """A Compute Engine / GKE resource name (MIG, instance template prefix, node pool, router, address)."""
    if len(name) > GCE_NAME_MAX:
        return f"{len(name)} characters, Compute Engine allows {GCE_NAME_MAX}"
    if not _GCE_NAME.match(name):
        return "Compute Engine names are lowercase letters, digits and '-', starting with a letter and not ending with '-'"
    return None


def label_value(value: str) -> str | None:
    if len(value) > LABEL_MAX:
        return f"{len(value)} characters, labels allow {LABEL_MAX}"
    if not _LABEL_VALUE.match(value):
        return "label values are lowercase letters, digits, '_' and '-', beginning and ending with a letter or digit"
    return None


def account_id(value: str) -> str | None:
    if not ACCOUNT_ID_MIN <= len(value) <= ACCOUNT_ID_MAX:
        return f"{len(value)} characters, service account ids are {ACCOUNT_ID_MIN}-{ACCOUNT_ID_MAX}"
    if not _ACCOUNT_ID.match(value):
        return "service account ids are lowercase letters, digits and '-', starting with a letter and not ending with '-'"
    return None


def bucket(name: str) -> str | None:
    limit = BUCKET_DOTTED_MAX if "." in name else BUCKET_MAX
    if not BUCKET_MIN <= len(name) <= limit:
        return f"{len(name)} characters, bucket names are {BUCKET_MIN}-{BUCKET_MAX} ({BUCKET_DOTTED_MAX} with dots)"
    if not _BUCKET.match(name) or ".." in name:
        return "bucket names are lowercase letters, digits, '-', '_' and '.', beginning and ending with a letter or digit"
    if any(len(part) > BUCKET_MAX for part in name.split(".")):
        return f"each dot-separated part of a bucket name is at most {BUCKET_MAX} characters"
    try:
        ipaddress.ip_address(name)
        return "bucket names cannot be IP addresses"
    except ValueError:
        pass
    if name.startswith("goog") or "google" in name:
        return "bucket names cannot start with 'goog' or contain 'google'"
    return None


def dns_name(name: str) -> str | None:
    """A full DNS name (record + zone): label and total lengths."""
    long = [label for label in name.rstrip(".").split(".") if len(label) > DNS_LABEL_MAX]
    if long:
        return f"the label {long[0][:20]!r}... is {len(long[0])} characters, DNS allows {DNS_LABEL_MAX} per label"
    if len(name.rstrip(".")) > DNS_NAME_MAX:
        return f"{len(name.rstrip('.'))} characters, DNS names allow {DNS_NAME_MAX}"
    return None
