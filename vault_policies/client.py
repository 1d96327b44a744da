"""Training side: turn a wrapped single-use secret_id into API keys and a short-lived token.

hvac and the standard library only (requests/urllib3 come with hvac), so this module
installs into any training image. The environment contract, rendered by the jobs layer:

    VAULT_ADDR                        e.g. https://vault.internal:8200 (+ VAULT_CACERT, VAULT_NAMESPACE)
    GPUFLEET_VAULT_ROLE               the role's name (optional; then the wrap must come from it)
    GPUFLEET_VAULT_ROLE_ID            the role's role_id (not secret)
    GPUFLEET_VAULT_WRAPPED_SECRET_ID  the wrapping token around a single-use secret_id
    GPUFLEET_SECRETS                  ENV_NAME=kv/path#key,...  paths relative to the secret/ KV v2 mount

Before unwrapping, the wrapping token is looked up: it must exist and have been created by
``auth/approle/role/<role>/secret-id``; anything else (already unwrapped, swapped for a
re-wrap of other data) raises :class:`PossibleInterception` without touching it. Proxy and
CA-bundle variables of the environment are ignored (only VAULT_CACERT is honoured), so a job
cannot redirect the wrapper's Vault traffic.

Use it as a context manager so the token is revoked however the run ends (SIGTERM
included, when entered from the main thread)::

    with start_task(TaskConfig.from_env(os.environ)) as task:
        train(api_key=task.secrets["WANDB_API_KEY"])
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import hvac
import hvac.exceptions
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from vault_policies.layout import APPROLE_MOUNT, ENV_ROLE, ENV_ROLE_ID, ENV_SECRETS, ENV_WRAPPED_SECRET_ID, ENV_WRAPPED_SECRET_ID_FILE, KV_MOUNT

REQUEST_TIMEOUT_SECONDS = 10
RETRY_STATUSES = (412, 500, 502, 503, 504)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KV_PATH = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*$")


class VaultClientError(Exception):
    """One clear line for the task log: what failed, the likely cause, what to do."""


class MalformedEnvironment(VaultClientError):
    """The task environment is incomplete or malformed; nothing was sent to Vault."""


class VaultUnavailable(VaultClientError):
    """Vault could not be reached, or answered with a server error."""


class WrappingTokenError(VaultClientError):
    pass


class PossibleInterception(WrappingTokenError):
    """The wrap was used or swapped, or the login failed right after unwrapping: someone
    else may hold this task's secret_id."""


class TokenRenewalError(VaultClientError):
    pass


class TokenRevoked(TokenRenewalError):
    """Vault answered 403 to a renewal: the token was revoked (incident response) or expired."""


# A wrapped secret_id comes from exactly this endpoint; a re-wrap via sys/wrapping/wrap does not.
_SECRET_ID_PATH = re.compile(rf"^auth/{APPROLE_MOUNT}/role/([^/]+)/secret-id$")
# The token is renewed at least this often, so a revocation stops the run within a minute.
MAX_RENEW_INTERVAL_SECONDS = 60.0


@dataclass(frozen=True)
class SecretRef:
    env_name: str
    path: str
    key: str


def parse_secrets(spec: str) -> tuple[SecretRef, ...]:
    """``HF_TOKEN=ml-api-keys/huggingface#token,...`` -> refs; a malformed entry names itself."""
    refs = []
    seen = set()
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            continue
        env_name, eq, target = entry.partition("=")
        path, hash_, key = target.partition("#")
        if not eq or not hash_ or not _ENV_NAME.match(env_name) or not _KV_PATH.match(path) or not key:
            raise MalformedEnvironment(f"{ENV_SECRETS} entry {entry!r} is malformed; write ENV_NAME=path/in/{KV_MOUNT}#key, e.g. HF_TOKEN=ml-api-keys/huggingface#token")
        if env_name in seen:
            raise MalformedEnvironment(f"{ENV_SECRETS} names {env_name} twice; give each variable one source")
        seen.add(env_name)
        refs.append(SecretRef(env_name, path, key))
    return tuple(refs)


def _read_token_file(path: str) -> str:
    """The wrapping token a Kubernetes pod gets as a file of its run's Secret (one per rank)."""
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise MalformedEnvironment(f"{ENV_WRAPPED_SECRET_ID_FILE} {path!r} cannot be read ({exc.strerror}); the run's Secret is missing or this rank has no key in it: re-dispatch") from None
    if not token:
        raise MalformedEnvironment(f"{ENV_WRAPPED_SECRET_ID_FILE} {path!r} is empty; re-dispatch the run")
    return token


@dataclass(frozen=True)
class TaskConfig:
    addr: str
    role_id: str
    wrapping_token: str = field(repr=False)
    secrets: tuple[SecretRef, ...]
    cacert: str | None = None
    namespace: str | None = None
    role: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TaskConfig:
        wrapped_from = ENV_WRAPPED_SECRET_ID if env.get(ENV_WRAPPED_SECRET_ID) or not env.get(ENV_WRAPPED_SECRET_ID_FILE) else ENV_WRAPPED_SECRET_ID_FILE
        missing = [name for name in ("VAULT_ADDR", ENV_ROLE_ID, wrapped_from) if not env.get(name)]
        if missing:
            raise MalformedEnvironment(f"missing environment variable(s) {', '.join(missing)}; the dispatcher sets them (gpufleet jobs dispatch / run-local)")
        return cls(
            addr=env["VAULT_ADDR"],
            role_id=env[ENV_ROLE_ID],
            wrapping_token=env[ENV_WRAPPED_SECRET_ID] if wrapped_from == ENV_WRAPPED_SECRET_ID else _read_token_file(env[ENV_WRAPPED_SECRET_ID_FILE]),
            secrets=parse_secrets(env.get(ENV_SECRETS, "")),
            cacert=env.get("VAULT_CACERT") or None,
            namespace=env.get("VAULT_NAMESPACE") or None,
            role=env.get(ENV_ROLE) or None,
        )


def retrying_session(*, attempts: int = 4, backoff_seconds: float = 0.25) -> requests.Session:
    """A session that retries connection errors and 5xx/412 with exponential backoff.

    Read errors are not retried: a request that reached Vault (an unwrap, a login) may have
    consumed a single-use credential, and a retry would then misreport the cause.
    """
    retry = Retry(
        total=attempts,
        connect=attempts,
        read=0,
        status=attempts,
        backoff_factor=backoff_seconds,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=None,
        raise_on_status=False,
    )
    session = requests.Session()
    # No HTTP(S)_PROXY, REQUESTS_CA_BUNDLE or .netrc from the environment: a job's env must not
    # route or trust-anchor the token holder's Vault traffic. VAULT_CACERT is passed explicitly.
    session.trust_env = False
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def make_client(addr: str, *, token: str | None = None, cacert: str | None = None, namespace: str | None = None) -> hvac.Client:
    # token="" rather than None: hvac would otherwise pick up VAULT_TOKEN or ~/.vault-token.
    return hvac.Client(url=addr, token=token or "", verify=cacert or True, namespace=namespace, session=retrying_session(), timeout=REQUEST_TIMEOUT_SECONDS)


def _unreachable(addr: str, exc: Exception) -> VaultClientError:
    return VaultUnavailable(f"cannot reach Vault at {addr} after retries, or it answered with a server error ({type(exc).__name__}); check VAULT_ADDR, VAULT_CACERT and the network from this task")


INTERCEPTION = "POSSIBLE INTERCEPTION: "
REPORT = "treat the role's secret_ids as compromised, check Vault's audit log for who unwrapped it, and re-dispatch the task"


def _lookup_wrap(client: hvac.Client, config: TaskConfig) -> str:
    """The wrapping token's creation path, checked before anything consumes it."""
    client.token = ""
    try:
        info = client.adapter.post("/v1/sys/wrapping/lookup", json={"token": config.wrapping_token})
    except hvac.exceptions.InvalidRequest:
        raise PossibleInterception(f"{INTERCEPTION}the wrapping token in {ENV_WRAPPED_SECRET_ID} is unknown to Vault: someone else already unwrapped it, or it expired while the task waited longer than its wrap TTL; {REPORT}") from None
    path = str(((info or {}).get("data") or {}).get("creation_path", ""))
    found = _SECRET_ID_PATH.match(path)
    if not found or (config.role and found.group(1) != config.role):
        want = f"auth/{APPROLE_MOUNT}/role/{config.role or '<role>'}/secret-id"
        raise PossibleInterception(f"{INTERCEPTION}the wrapping token in {ENV_WRAPPED_SECRET_ID} was created by {path or '(unknown)'!r}, not {want!r}: it was swapped for another wrap (not unwrapped, so it stays as evidence); {REPORT}")
    return path


def _unwrap(client: hvac.Client, config: TaskConfig) -> str:
    _lookup_wrap(client, config)
    client.token = config.wrapping_token
    try:
        data = client.sys.unwrap().get("data") or {}
    except (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden):
        raise PossibleInterception(f"{INTERCEPTION}the wrapping token in {ENV_WRAPPED_SECRET_ID} was unwrapped by someone else between lookup and unwrap; {REPORT}") from None
    finally:
        client.token = ""
    secret_id = data.get("secret_id") if isinstance(data, dict) else None
    if not isinstance(secret_id, str) or not secret_id:
        raise PossibleInterception(f"{INTERCEPTION}the wrapping token in {ENV_WRAPPED_SECRET_ID} held no secret_id; {REPORT}")
    return secret_id


def _login(client: hvac.Client, config: TaskConfig, secret_id: str) -> dict[str, Any]:
    try:
        auth = client.auth.approle.login(config.role_id, secret_id, mount_point=APPROLE_MOUNT, use_token=True)["auth"]
    except hvac.exceptions.InvalidRequest as exc:
        if "CIDR" in str(exc):
            raise VaultClientError(f"AppRole login refused for {ENV_ROLE_ID} {config.role_id}: this host's address is outside the role's bound CIDRs (the task runs on a cluster its role is not bound to); add the cluster to the role's clusters in vault_policies/roles.yaml, render and apply, then re-dispatch") from None
        raise PossibleInterception(f"{INTERCEPTION}AppRole login refused right after unwrapping ({ENV_ROLE_ID} {config.role_id}): the secret_id was used by someone else first, or the role_id was swapped; {REPORT}") from None
    role = (auth.get("metadata") or {}).get("role_name")
    if config.role and role != config.role:
        client.auth.token.revoke_self()
        raise PossibleInterception(f"{INTERCEPTION}logged in as role {role!r}, not {config.role!r}: the role_id was swapped; the token was revoked; {REPORT}")
    return auth


def _read_secrets(client: hvac.Client, refs: tuple[SecretRef, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    cache: dict[str, dict[str, Any]] = {}
    for ref in refs:
        if ref.path not in cache:
            where = f"{KV_MOUNT}/data/{ref.path}"
            try:
                cache[ref.path] = client.secrets.kv.v2.read_secret_version(ref.path, mount_point=KV_MOUNT, raise_on_deleted_version=True)["data"]["data"]
            except hvac.exceptions.Forbidden:
                raise VaultClientError(f"this role may not read {where} (wanted for {ref.env_name}); add the path to the role's policy in vault_policies/policies/ and run `gpufleet vault apply`, or fix {ENV_SECRETS}") from None
            except hvac.exceptions.InvalidPath:
                raise VaultClientError(f"no secret at {where} (wanted for {ref.env_name}), or its latest version is deleted; write it with `bao kv put {KV_MOUNT}/{ref.path} {ref.key}=...` or fix {ENV_SECRETS}") from None
        data = cache[ref.path]
        if ref.key not in data:
            raise VaultClientError(f"{KV_MOUNT}/data/{ref.path} has no key {ref.key!r} (wanted for {ref.env_name}); keys there: {', '.join(sorted(data)) or '(none)'}; fix {ENV_SECRETS}")
        values[ref.env_name] = str(data[ref.key])
    return values


def _default_failure(exc: TokenRenewalError) -> None:
    print(f"gpufleet vault: error: {exc}", file=sys.stderr, flush=True)


class TaskSession:
    """A logged-in task: its keys, a background renewer, and revocation on close."""

    def __init__(self, client: hvac.Client, auth: dict[str, Any], secrets: dict[str, str], on_renewal_failure: Callable[[TokenRenewalError], None]) -> None:
        self.client = client
        self.secrets = secrets
        self.policies = tuple(auth.get("token_policies") or auth.get("policies") or ())
        self.lease_seconds = int(auth["lease_duration"])
        self.renewal_error: TokenRenewalError | None = None
        self._on_failure = on_renewal_failure
        self._expires_at = time.monotonic() + self.lease_seconds
        self._stop = threading.Event()
        self._closed = False
        self._previous_sigterm: Any = None
        self._renewer = threading.Thread(target=self._renew_loop, name="gpufleet-vault-renew", daemon=True)
        if auth.get("renewable"):
            self._renewer.start()

    def __repr__(self) -> str:
        return f"TaskSession(policies={self.policies}, lease_seconds={self.lease_seconds}, secrets={sorted(self.secrets)})"

    @property
    def margin_seconds(self) -> float:
        """How long before expiry a failure is reported, so the run can stop cleanly; at least
        2 s so that a loaded host still reports while the token works."""
        return min(60.0, max(2.0, self.lease_seconds * 0.1))

    def _fail(self, message: str) -> None:
        self.renewal_error = TokenRenewalError(message)
        self._on_failure(self.renewal_error)

    def _renew_loop(self) -> None:
        capped = False
        wait = min(self.lease_seconds / 2, MAX_RENEW_INTERVAL_SECONDS)
        while not self._stop.wait(max(0.2, wait)):
            remaining = self._expires_at - time.monotonic()
            if capped:
                self._fail(f"the Vault token reaches the role's token_max_ttl in {remaining:.0f}s and cannot be renewed further; raise token_max_ttl in vault_policies/roles.yaml to cover the longest run, or set token_period")
                return
            try:
                lease = int(self.client.auth.token.renew_self()["auth"]["lease_duration"])
            except hvac.exceptions.Forbidden:
                self.renewal_error = TokenRevoked("Vault refused to renew the task token (403): it was revoked, by an operator responding to an incident or by its parent; stopping now")
                self._on_failure(self.renewal_error)
                return
            except (hvac.exceptions.VaultError, requests.RequestException) as exc:
                if remaining <= self.margin_seconds * 2:
                    self._fail(f"cannot renew the Vault token ({type(exc).__name__}: {exc}) and it expires in {remaining:.0f}s; check that Vault is reachable from this task")
                    return
                wait = min(5.0, remaining / 4)
                continue
            self._expires_at = time.monotonic() + lease
            capped = lease < self.lease_seconds
            wait = lease - self.margin_seconds if capped else min(lease / 2, MAX_RENEW_INTERVAL_SECONDS)

    def close(self) -> bool:
        """Stop renewing and revoke the token; True when Vault confirmed the revocation."""
        if self._closed:
            return True
        self._closed = True
        self._stop.set()
        if self._renewer.is_alive():
            self._renewer.join(timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            self.client.auth.token.revoke_self()
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            print(f"gpufleet vault: warning: could not revoke the task token ({type(exc).__name__}); it expires on its own at its TTL", file=sys.stderr, flush=True)
            return False
        finally:
            self.client.token = ""
            self.client.adapter.close()
        return True

    def __enter__(self) -> TaskSession:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self.close()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Turn SIGTERM into SystemExit so ``with`` blocks unwind and the token is revoked."""
    raise SystemExit(128 + signum)


def start_task(config: TaskConfig, *, on_renewal_failure: Callable[[TokenRenewalError], None] = _default_failure) -> TaskSession:
    """Unwrap, log in, read the requested keys and start renewing; raises VaultClientError."""
    client = make_client(config.addr, cacert=config.cacert, namespace=config.namespace)
    unreachable = (requests.ConnectionError, requests.Timeout, hvac.exceptions.VaultDown, hvac.exceptions.InternalServerError)
    try:
        auth = _login(client, config, _unwrap(client, config))
    except unreachable as exc:
        raise _unreachable(config.addr, exc) from None
    session = TaskSession(client, auth, {}, on_renewal_failure)
    try:
        session.secrets.update(_read_secrets(client, config.secrets))
    except BaseException as exc:
        session.close()
        if isinstance(exc, unreachable):
            raise _unreachable(config.addr, exc) from None
        raise
    return session
