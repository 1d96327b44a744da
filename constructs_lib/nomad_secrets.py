"""The Secret Manager secrets Nomad agents read at boot (CA, certificates, keys, gossip key).

Terraform creates each secret *empty* and grants read access per agent role; the values are
added as secret versions by the generated bootstrap (``gpufleet nomad bootstrap-script``), so
no key or certificate ever passes through the synthesized JSON or Terraform state. Servers and
clients run as different service accounts, so a GPU client (which runs tenant code) can read
the client certificate but never the server key or the gossip key.
"""

from __future__ import annotations

from constructs import Construct

from clusters.derive.nomad import NomadRole, NomadSecretSpec
from constructs_lib.naming import pin
from constructs_lib.providers import google

ACCESSOR = "roles/secretmanager.secretAccessor"


class NomadSecrets(Construct):
    """``self.secrets[name]`` is the secret resource (escape hatch); ``self.grants`` its reader bindings."""

    def __init__(self, scope: Construct, id_: str, *, cluster: str, project: str, secrets: tuple[NomadSecretSpec, ...],
                 readers: dict[NomadRole, str], protected: bool) -> None:
        super().__init__(scope, id_)
        self.secrets = {}
        self.grants = {}
        for spec in secrets:
            key = spec.name.replace("-", "_")
            self.secrets[spec.name] = pin(google.secret_manager_secret.SecretManagerSecret(
                self, f"secret_{key}", secret_id=spec.secret_id, project=project, replication={"auto": {}},
                labels={"gpufleet-cluster": cluster, "nomad-secret": spec.name},
                # Losing the secret loses the cluster's identity: every agent would fail to boot.
                # Protected outside dev, like the servers that read it.
                lifecycle={"prevent_destroy": protected},
            ), f"nomad_secret_{key}")
            for role in spec.readers:
                if role not in readers:
                    continue
                self.grants[(spec.name, role)] = pin(google.secret_manager_secret_iam_member.SecretManagerSecretIamMember(
                    self, f"reader_{key}_{role.value}", project=project, secret_id=self.secrets[spec.name].secret_id,
                    role=ACCESSOR, member=f"serviceAccount:{readers[role]}",
                ), f"nomad_secret_{key}_{role.value}")
