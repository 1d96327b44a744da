"""Planted secrets are found and located; names of secrets, references and TTLs are not; values never printed.

Every fake secret is assembled at run time from random characters, so nothing realistic is
committed; the draw is seeded (and the global RNG restored) so a run cannot flake.
"""

from __future__ import annotations

import base64
import json
import random
import string
import uuid
from pathlib import Path

import pytest

from gpufleet.cli import main
from clusters.errors import UserError
from safety.secret_scan import scan_paths, scan_targets
from tests.safety.conftest import tf

ALNUM = string.ascii_letters + string.digits


def rand(n: int, alphabet: str = ALNUM) -> str:
    return "".join(random.choices(alphabet, k=n))


def shuffled_hex() -> str:
    """32 hex digits, each digit twice in random order: random-looking, with entropy fixed at 4 bits so the test cannot flake."""
    digits = list("0123456789abcdef" * 2)
    random.shuffle(digits)
    return "".join(digits)


def fake_pem() -> str:
    return "-----BEGIN " + "RSA PRIVATE" + " KEY-----\n" + base64.b64encode(random.randbytes(96)).decode() + "\n-----END RSA PRIVATE KEY-----\n"


def fake_sa_key() -> str:
    key = {"type": "service_account", "project_id": "p", "private_key_id": rand(40, "0123456789abcdef"), "private_key": fake_pem()}
    return base64.b64encode(json.dumps(key).encode()).decode()


PLANTED = {
    "github": lambda: "gh" + "p_" + rand(36),
    "slack": lambda: "xo" + "xb-" + rand(12, string.digits) + "-" + rand(24),
    "aws": lambda: "AK" + "IA" + rand(16, string.ascii_uppercase + string.digits),
    "openai": lambda: "s" + "k-proj-" + rand(48),
    "hf": lambda: "h" + "f_" + rand(34),
}
KINDS = {"github": "github-token", "slack": "slack-token", "aws": "aws-access-key-id", "openai": "openai-key", "hf": "huggingface-token"}


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A synthesized-looking stack with one secret per detector, and the clean look-alikes around them.

    Seeded: a 40-character random draw falls under the entropy bar about once in a thousand.
    """
    outer = random.getstate()
    random.seed(20261202)
    values = {name: make() for name, make in PLANTED.items()}
    values |= {"pem": fake_pem(), "sa": fake_sa_key(), "vault": "s." + rand(24), "cf": rand(40, ALNUM + "_-"), "hex": shuffled_hex(), "uuid": str(uuid.uuid4())}
    random.setstate(outer)
    stack = {
        "//": {"metadata": {"path": "s", "note": values["vault"]}},
        "resource": {
            "google_service_account_key": {"k": {"private_key": values["sa"]}},
            "terraform_data": {
                "a": {"input": {"description": f"uses {values['github']} for CI"}},
                "b": {"input": {"labels": [values["slack"], values["aws"]], "cfg": {"openai": values["openai"], "hf": values["hf"]}}},
                "c": {"input": {"tls_private_key": values["pem"], "vault_token": values["vault"], "cloudflare_api_token": values["cf"]}},
                "d": {"input": {"db_password": values["hex"], "NOMAD_TOKEN": values["uuid"]}},
                "clean": {
                    "input": {
                        "description": values["vault"],
                        "secret_name": "prod-hf-api-token",
                        "token_ttl": "768h",
                        "api_key_env": "HF_TOKEN",
                        "password": "${var.db_password}",
                        "client_secret": "gpufleet-oauth-client-secret",
                        "tokens": ["a", "b"],
                        "GPUFLEET_SECRETS": "OPENAI_API_KEY=ml-api-keys/openai#api_key,HF_TOKEN=ml-api-keys/hf#token",
                        "secret_ref": "projects/ml-train-prod/secrets/hf-token/versions/3",
                        "machine": "a3-highgpu-8g",
                        "disk-balanced-sk-x": "skipped",
                    }
                },
            },
        },
    }
    path = tmp_path / "cdktf.out" / "stacks" / "s" / "cdk.tf.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(stack, indent=2))
    return tmp_path, values


def test_planted_secrets_are_found_with_json_paths(planted: tuple[Path, dict[str, str]]) -> None:
    root, _ = planted
    found = {(f.path, f.kind) for f in scan_paths([root / "cdktf.out"])}
    assert found == {
        ("$.resource.google_service_account_key.k.private_key", "gcp-service-account-key"),
        ("$.resource.terraform_data.a.input.description", "github-token"),
        ("$.resource.terraform_data.b.input.labels[0]", "slack-token"),
        ("$.resource.terraform_data.b.input.labels[1]", "aws-access-key-id"),
        ("$.resource.terraform_data.b.input.cfg.openai", "openai-key"),
        ("$.resource.terraform_data.b.input.cfg.hf", "huggingface-token"),
        ("$.resource.terraform_data.c.input.tls_private_key", "private-key"),
        ("$.resource.terraform_data.c.input.vault_token", "vault-token"),
        ("$.resource.terraform_data.c.input.cloudflare_api_token", "api-token"),
        ("$.resource.terraform_data.d.input.db_password", "high-entropy-secret"),
        ("$.resource.terraform_data.d.input.NOMAD_TOKEN", "uuid-token"),
    }


def test_vault_prefix_alone_outside_a_sensitive_field_is_not_a_finding(planted: tuple[Path, dict[str, str]]) -> None:
    root, _ = planted
    assert not [f for f in scan_paths([root]) if ".clean." in f.path or f.path.startswith("$.//")]


def test_findings_never_contain_the_value(planted: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    root, values = planted
    findings = scan_paths([root])
    assert main(["scan", str(root)]) == 1
    printed = capsys.readouterr().out + "\n".join(str(f) for f in findings)
    for value in values.values():
        random_part = value.splitlines()[1] if "\n" in value else value[-12:]
        assert value not in printed and random_part not in printed


def test_secret_in_real_terraform_state_is_found(tmp_path: Path) -> None:
    token = "h" + "f_" + rand(34)
    (tmp_path / "main.tf.json").write_text(json.dumps({"resource": {"terraform_data": {"job": {"input": {"api_token": token}}}}}))
    tf(tmp_path, "init", "-input=false")
    tf(tmp_path, "apply", "-auto-approve", "-input=false")
    state = tmp_path / "state.json"
    state.write_text(tf(tmp_path, "show", "-json"))
    paths = {f.path for f in scan_paths([state])}
    assert "$.values.root_module.resources[0].values.input.api_token" in paths
    assert main(["scan", "--state", str(state)]) == 1


def test_text_files_are_scanned_by_line(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text("not json\nenv HF=" + "h" + "f_" + rand(34) + "\n")
    assert [(f.path, f.kind) for f in scan_paths([job])] == [("line 2", "huggingface-token")]


def test_clean_tree_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"Job": {"Meta": {"vault_role": "finetune", "token_ttl": "1h"}}}))
    assert main(["scan", str(tmp_path)]) == 0
    assert "no secret values found" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["scan"], ["check", "--skip-checkov"]])
def test_fails_when_state_file_is_missing(command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``scan`` and ``check`` share the one rule (safety.secret_scan.require_state_files)."""
    paths = [str(tmp_path)] if command == ["scan"] else ["--out", str(tmp_path / "out")]
    assert main([*command, *paths, "--state", str(tmp_path / "state.json")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --state {tmp_path / 'state.json'}: file not found; write it with `terraform show -json > {tmp_path / 'state.json'}`"


def test_scan_targets_default_to_the_generated_dirs_that_exist(tmp_path: Path) -> None:
    (tmp_path / "jobs" / "out").mkdir(parents=True)
    state = tmp_path / "state.json"
    state.write_text("{}")
    assert scan_targets([], [], base=tmp_path) == [tmp_path / "jobs" / "out"]
    (tmp_path / "cdktf.out").mkdir()
    assert scan_targets([], [state], base=tmp_path) == [tmp_path / "cdktf.out", tmp_path / "jobs" / "out", state]
    assert scan_targets([state], [], base=tmp_path) == [state]


def test_fails_when_there_is_nothing_to_scan(tmp_path: Path) -> None:
    """A clean report over no files would read as a pass."""
    with pytest.raises(UserError, match=r"^nothing to scan: neither cdktf.out nor jobs/out exists; run `gpufleet synth` and `gpufleet jobs render` first, or pass paths$"):
        scan_targets([], [], base=tmp_path)
    with pytest.raises(UserError, match=r"missing: not found; pass an existing file or directory"):
        scan_targets([tmp_path / "missing"], [], base=tmp_path)


def test_synthesized_example_fleet_has_no_findings(fleet_out: Path) -> None:
    """Guards against false positives on real output: a noisy scan gets switched off."""
    assert scan_paths([fleet_out]) == []
