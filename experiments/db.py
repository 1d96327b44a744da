"""Database URLs, engines and migrations: SQLite (WAL, under .gpufleet/) or PostgreSQL.

SQLite: every transaction starts with BEGIN IMMEDIATE, so writers queue on the database lock
(busy_timeout) instead of failing when two requests upgrade a read lock at once; that also
makes the quota count and the insert of a submission one atomic step. PostgreSQL: the same
step locks the tenant's ``pool_usage`` row (services.experiments.submit); pooled connections are
checked without a round trip (``_refuse_closed_by_server``).
"""

from __future__ import annotations

import secrets
import select
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from clusters import repo
from clusters.errors import UserError

DEFAULT_SQLITE = Path(".gpufleet") / "experiments.db"  # under the repository root (clusters.repo)
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_MS = 30_000
POOL_RECYCLE_S = 300  # under the idle timeout of what may sit between (an AWS Network Load Balancer drops idle TCP at 350 s)
# This process's mark on its PostgreSQL sessions (``application_name``), also the start of its worker ids
# (background.membership): an operator finds a worker's sessions in pg_stat_activity by it.
PROCESS_TAG = secrets.token_hex(6)
APPLICATION_NAME = f"gpufleet {PROCESS_TAG}"


def database_url(value: str | None) -> str:
    """``--db``: a postgresql:// URL, a sqlite:/// URL, or empty for .gpufleet/experiments.db."""
    if not value:
        path = repo.root() / DEFAULT_SQLITE
        path.parent.mkdir(mode=0o700, exist_ok=True)
        return f"sqlite:///{path}"
    if value.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + value.split("://", 1)[1]
    if value.startswith(("postgresql+psycopg://", "sqlite:///")):
        return value
    raise UserError(f"--db {make_url_safe(value)!r} is not a database URL; allowed: postgresql://user@host/db, sqlite:///path/file.db, or nothing for {DEFAULT_SQLITE}")


def make_url_safe(value: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(value).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL at all: show only the scheme part
        return value.split("://", 1)[0] + "://..."


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_MS / 1000}, pool_size=20, max_overflow=40)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(connection) -> None:  # type: ignore[no-untyped-def]
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    engine = create_engine(
        url, pool_size=20, max_overflow=40, pool_recycle=POOL_RECYCLE_S, connect_args={"application_name": APPLICATION_NAME}
    )
    event.listen(engine, "checkout", _refuse_closed_by_server)
    return engine


def _refuse_closed_by_server(dbapi_connection, _record, _proxy) -> None:  # type: ignore[no-untyped-def]
    """Liveness of a pooled PostgreSQL connection without a round trip (what ``pool_pre_ping`` costs on
    every checkout: two of a submit's round trips). A connection idle in the pool has nothing to read
    unless the server wrote to it: a restart, ``pg_terminate_backend`` or an idle timeout sends its
    FATAL error and closes the socket. So a readable socket, or a connection psycopg already knows is
    closed, is refused here, and the pool (SQLAlchemy's documented checkout contract) discards it and
    takes or opens another. A server that vanished without closing the socket is caught by the first
    statement instead: SQLAlchemy sees the disconnect, invalidates the whole pool, and that request
    fails once; ``pool_recycle`` bounds how old any connection gets."""
    if server_closed(dbapi_connection):
        raise DisconnectionError("the connection is closed, or the server wrote to it while idle (it closed it)")


def server_closed(dbapi_connection) -> bool:  # type: ignore[no-untyped-def]
    """Whether an idle psycopg connection is known closed or has something to read (the server's FATAL
    error before it closes the socket), without a round trip: the pool's checkout test above, and the
    worker's check of the connection that holds its advisory lock (background.membership)."""
    if dbapi_connection.closed or dbapi_connection.broken:
        return True
    idle = select.poll()  # not select.select(): a busy server's descriptors pass FD_SETSIZE (1024)
    idle.register(dbapi_connection.fileno(), select.POLLIN)
    return bool(idle.poll(0))  # readable, hung up or in error


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def single_statements(engine: Engine) -> Iterator[Connection]:
    """A pooled connection on which, on PostgreSQL, each statement is its own transaction: a request that
    only reads one row, like the token lookup of every API call, then skips the BEGIN and ROLLBACK round
    trips. A Core connection, not a Session: the lookup runs on every request, and a Session around it
    cost about as much CPU again as the query. SQLite keeps its transaction (BEGIN IMMEDIATE is how its
    readers and writers queue), rolled back when the block ends, as a Session's was."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        yield connection


def single_statement_session(session: Session) -> Session:
    """``single_statements`` for ORM reads: on PostgreSQL each of this (new) session's statements is its own
    transaction (the dispatch loop's due-check and claim read-back); SQLite keeps its transactions."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return session


def _alembic(engine: Engine, action: str, target: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, target)


def upgrade(engine: Engine, target: str = "head") -> None:
    """Migrate to ``target``. This is the first time a command touches the database, so a server that
    cannot be reached (down, wrong host or port, bad credentials) is one line here, not a traceback
    from deep inside the driver."""
    try:
        _alembic(engine, "upgrade", target)
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0] if str(exc.orig or exc).strip() else type(exc.orig).__name__
        shown = engine.url.render_as_string(hide_password=True).replace("postgresql+psycopg://", "postgresql://", 1)
        raise UserError(f"--db {shown}: cannot reach the database ({reason}); start PostgreSQL"
                        " there or fix the host, port, user or database name in the URL, or omit --db to use SQLite in"
                        f" {DEFAULT_SQLITE}") from None


def downgrade(engine: Engine, target: str = "-1") -> None:
    _alembic(engine, "downgrade", target)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
