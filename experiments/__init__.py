"""The experiments control plane behind ``gpufleet serve``.

Shaped like dstack's server: ``app.py`` builds the FastAPI app, ``routers/`` parse and
authorize, ``services/`` hold the logic, ``background/`` has one task per lifecycle step
(dispatch, reconcile, reap), ``models.py`` the SQLAlchemy tables and ``migrations/`` the
Alembic revisions. Every state change goes through ``services.lifecycle.transition`` and
leaves an event row.
"""
