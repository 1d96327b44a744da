"""Every resource quantity in a ``kubernetes_manifest`` is written in Kubernetes' canonical form.

An admission webhook that defaults an object (Kueue's ClusterQueue webhook adds a finalizer,
kueue v0.19.2 pkg/webhooks/clusterqueue_webhook.go) makes controller-runtime re-encode the whole
object and patch back the difference, so "100000" is stored as "100k"; kubernetes_manifest then
fails the apply with "Provider produced inconsistent result" (hashicorp/terraform-provider-
kubernetes#1572). The oracle below follows apimachinery's ``Quantity.CanonicalizeBytes``
(pkg/api/resource/quantity.go): no fractional digits, the largest suffix that keeps the value
exact, binary suffixes kept binary for |value| >= 1024.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

import pytest

DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
QUANTITY = re.compile(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
QUANTITY_KEYS = {"nominalQuota", "borrowingLimit", "lendingLimit"}
QUANTITY_MAPS = {"requests", "limits", "hard", "default", "defaultRequest", "max", "min"}


def canonical(text: str) -> str:
    number, suffix = QUANTITY.match(text).groups()  # type: ignore[union-attr]
    suffix = suffix or ""
    value = Fraction(Decimal(number))
    if suffix in BINARY:
        value *= 2 ** BINARY[suffix]
        if abs(value) >= 1024 and value.denominator == 1:
            power = 0
            while power < 60 and value % (2 ** (power + 10)) == 0:
                power += 10
            return f"{int(value / 2 ** power)}{next((s for s, p in BINARY.items() if p == power), '')}"
    elif suffix and suffix[0] in "eE":
        value *= Fraction(10) ** int(suffix[1:])
    else:
        value *= Fraction(10) ** DECIMAL[suffix]
    if value == 0:
        return "0"
    exponent = -9
    while exponent < 18 and (value / Fraction(10) ** (exponent + 3)).denominator == 1:
        exponent += 3
    mantissa = value / Fraction(10) ** exponent
    assert mantissa.denominator == 1, f"{text} is finer than 1n"
    return f"{int(mantissa)}{next(s for s, e in DECIMAL.items() if e == exponent)}"


@pytest.mark.parametrize(("text", "want"), [("100000", "100k"), ("100k", "100k"), ("1500", "1500"), ("0.5", "500m"), ("150m", "150m"),
                                             ("1000m", "1"), ("1000000Gi", "1000000Gi"), ("1024Mi", "1Gi"), ("512Mi", "512Mi"), ("1e3", "1k"), ("32", "32"), ("0", "0")])
def test_the_oracle_matches_apimachinery_examples(text, want):
    assert canonical(text) == want


def _quantities(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}"
            if key in QUANTITY_KEYS and isinstance(value, (str, int)):
                yield here, str(value)
            elif key in QUANTITY_MAPS and isinstance(value, dict) and all(isinstance(v, (str, int)) for v in value.values()):
                yield from ((f"{here}.{k}", str(v)) for k, v in value.items())
            else:
                yield from _quantities(value, here)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _quantities(value, f"{path}[{index}]")


def test_every_manifest_quantity_is_canonical(example_configs, stack_json):
    checked = 0
    for config in example_configs:
        if config.scheduler.value != "gke":
            continue
        manifests = stack_json(f"{config.name}-scheduler")["resource"].get("kubernetes_manifest", {})
        for name, resource in manifests.items():
            for path, value in _quantities(resource["manifest"]):
                if "${" in value:
                    continue
                checked += 1
                assert value == canonical(value), f"{config.name}-scheduler kubernetes_manifest.{name}.manifest{path} = {value!r}; write {canonical(value)!r}"
    assert checked > 20
