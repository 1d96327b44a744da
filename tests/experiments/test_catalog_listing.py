"""The catalog keeps its listing of jobs/ between submissions (``Catalog._job_files``) and lists the
directory again whenever it changed: a job file added, removed or renamed is seen by the very next
submission, also when the change falls within the coarse tick of the directory's mtime."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from experiments.errors import ApiError
from experiments.services import catalog as catalog_module
from experiments.services.catalog import Catalog
from jobs.loader import JOBS_DIR

JOB, LATER = "finetune-llama", "finetune-llama-gke"


def _aged(directory: Path, seconds: float) -> int:
    """Set the directory's mtime ``seconds`` into the past; returns it in ns."""
    stamp = time.time_ns() - int(seconds * 1_000_000_000)
    os.utime(directory, ns=(stamp, stamp))
    return stamp


@pytest.fixture
def jobs(tmp_path: Path, catalog: Catalog) -> tuple[Path, Catalog]:
    directory = tmp_path / "jobs"
    directory.mkdir()
    shutil.copy(JOBS_DIR / f"{JOB}.yaml", directory / f"{JOB}.yaml")
    return directory, Catalog(directory, configs=catalog.configs, vault=catalog.vault)


def test_a_job_file_added_or_removed_after_the_listing_is_kept_is_seen(jobs: tuple[Path, Catalog]) -> None:
    directory, catalog = jobs
    _aged(directory, 60)
    assert catalog.admit(JOB)[0].name == JOB
    assert catalog._listing is not None, "a listing of a directory unchanged for a minute is kept"
    shutil.copy(JOBS_DIR / f"{LATER}.yaml", directory / f"{LATER}.yaml")  # moves the directory's mtime
    assert catalog.admit(LATER)[0].name == LATER
    (directory / f"{LATER}.yaml").unlink()
    with pytest.raises(ApiError) as refused:
        catalog.admit(LATER)
    assert refused.value.status == 422 and f"no job {LATER!r}" in str(refused.value)


def test_a_listing_within_the_racy_window_is_not_kept(jobs: tuple[Path, Catalog]) -> None:
    """A second change in the same mtime tick leaves the stamp as it was: the listing taken between the
    two changes must not be served after the second one."""
    directory, catalog = jobs
    stamp = _aged(directory, catalog_module.RACY_S / 4)
    catalog.admit(JOB)
    shutil.copy(JOBS_DIR / f"{LATER}.yaml", directory / f"{LATER}.yaml")
    os.utime(directory, ns=(stamp, stamp))  # the add landed in the same tick: the stamp did not move
    assert catalog.admit(LATER)[0].name == LATER


def test_no_jobs_directory_is_an_unknown_job_not_a_crash(tmp_path: Path, catalog: Catalog) -> None:
    missing = Catalog(tmp_path / "nowhere", configs=catalog.configs, vault=catalog.vault)
    with pytest.raises(ApiError) as refused:
        missing.admit(JOB)
    assert refused.value.status == 422
