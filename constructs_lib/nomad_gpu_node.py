"""What a Nomad GPU client needs beyond the driver: Fabric Manager on NVSwitch hosts, its local SSDs as one
volume, GPU metrics (DCGM exporter) and the health checker that takes a failing node out.

Pure renderers of boot-script steps, HCL and the checker's ACL policy; nothing here knows cdktf. The steps run
in the client's boot script after the driver and the container toolkit and before Nomad starts.

**Why systemd units, not a Nomad system job**, for the exporter and the checker: the exporter must see every
GPU of the node without taking one from the scheduler, which through Nomad means a privileged container or
the NVIDIA runtime for every GPU, and the clients' docker plugin refuses privileged tasks
(``allow_privileged = false``, nomad_agent_config) so that no tenant job gets them; a system job would also
start only after the ACL bootstrap and a scheduler-stack apply, while a unit runs from the first boot, and
the checker must keep working when scheduling is what is broken.
"""

from __future__ import annotations

from pathlib import Path

from clusters.families import LOCAL_SSD_MOUNT, LOCAL_SSD_VOLUME
from constructs_lib import nomad_gpu_health_check

# --- Fabric Manager -------------------------------------------------------------------------------------
FABRIC_MANAGER_SERVICE = "nvidia-fabricmanager.service"

# The package of the running driver's branch at exactly the driver's version (Fabric Manager refuses to
# run against another driver version; the R570 release notes list "Fabric Manager: 570.133.20" beside
# driver 570.133.20). Ubuntu's archive, which the accelerator images' drivers come from, ships it as
# nvidia-fabricmanager-<branch>; apt-cache madison lists every version the sources hold, and the one
# starting with "<driver version>-" is taken. No match: the boot stops before Nomad starts. An installed
# package of another version (held by an earlier boot while the driver moved on: a rebuilt image, or
# unattended-upgrades updating the driver that the next reboot loads) is replaced, not just started.
_FABRIC_MANAGER = f"""# NVSwitch host: NVIDIA Fabric Manager of the driver's own version, running before Nomad.
if ! systemctl is-active --quiet {FABRIC_MANAGER_SERVICE}; then
  drv=$(nvidia-smi -i 0 --query-gpu=driver_version --format=csv,noheader | tr -d ' ')
  branch=$(echo "$drv" | cut -d. -f1)
  have=""
  if dpkg -s "nvidia-fabricmanager-$branch" >/dev/null 2>&1; then
    have=$(dpkg-query -W "nvidia-fabricmanager-$branch" | cut -f2)
  fi
  case "$have" in
    "$drv"-*) ;;
    *)
      apt-get update -q
      fm=$(apt-cache madison "nvidia-fabricmanager-$branch" | awk -v v="$drv-" '{{ if (index($3, v) == 1) {{ print $3; exit }} }}')
      if [ -z "$fm" ]; then echo "gpufleet: no nvidia-fabricmanager-$branch for driver $drv in the apt sources" >&2; exit 1; fi
      apt-get install -yq --allow-change-held-packages "nvidia-fabricmanager-$branch=$fm"
      apt-mark hold "nvidia-fabricmanager-$branch"
      ;;
  esac
  systemctl enable {FABRIC_MANAGER_SERVICE}
  systemctl start {FABRIC_MANAGER_SERVICE}
fi
mkdir -p /etc/systemd/system/nomad.service.d
printf '[Unit]\\nAfter={FABRIC_MANAGER_SERVICE}\\nRequires={FABRIC_MANAGER_SERVICE}\\n' > /etc/systemd/system/nomad.service.d/gpufleet-fabricmanager.conf
systemctl daemon-reload"""


def render_fabric_manager() -> str:
    return _FABRIC_MANAGER


# --- Local SSD ------------------------------------------------------------------------------------------
LOCAL_SSD_LABEL = "localssd"
# GCE names NVMe local SSDs google-local-nvme-ssd-<n> under /dev/disk/by-id (guest environment udev rules).
LOCAL_SSD_GLOB = "/dev/disk/by-id/google-local-nvme-ssd-*"
LOCAL_SSD_ARRAY = "/dev/md/localssd"
# The guest's udev rules make the by-id links as the NVMe namespaces are probed, which can still be going on
# when the startup script runs: the step settles udev and counts again, every 5 s for up to this many tries,
# before it gives up on a VM that lacks disks. (Counting once stopped healthy VMs whose last links came late.)
LOCAL_SSD_WAIT_TRIES = 30


def render_local_ssd(count: int) -> str:
    """One RAID0 array over the node's local SSDs, ext4, mounted at LOCAL_SSD_MOUNT for tasks (a host volume).

    Local SSD keeps its data across a reboot but not across a stop or a host error, so the array is made
    when no filesystem of its label exists (a new or a stopped-and-started VM) and only mounted otherwise.
    Disks that already carry md superblocks are never made into a new array (``--create --force`` and
    ``mkfs -F`` would wipe what the reboot kept): when ``--assemble --scan`` left the array unassembled, it is
    assembled from its members; an array without any filesystem (a boot cut short before mkfs) is formatted.
    The mount is in fstab (``nofail``) and Nomad requires it: after a reboot Nomad starts before this script,
    and a task must never write its scratch data to the boot disk instead.
    """
    return f"""# {count} local NVMe SSDs as one RAID0 volume at {LOCAL_SSD_MOUNT}.
command -v mdadm >/dev/null 2>&1 || {{ apt-get update -q && apt-get install -yq mdadm; }}
udevadm settle --timeout=30 || true  # udev's own assembly and label probing of the array, after a reboot
if ! blkid -L {LOCAL_SSD_LABEL} >/dev/null 2>&1; then
  mdadm --assemble --scan >/dev/null 2>&1 || true
fi
if ! blkid -L {LOCAL_SSD_LABEL} >/dev/null 2>&1; then
  for _ in $(seq {LOCAL_SSD_WAIT_TRIES}); do
    udevadm settle --timeout=10 || true
    found=$( (ls {LOCAL_SSD_GLOB} 2>/dev/null || true) | wc -l)
    [ "$found" -lt {count} ] || break
    sleep 5
  done
  if [ "$found" -ne {count} ]; then echo "gpufleet: expected {count} local NVMe SSDs, found $found" >&2; exit 1; fi
  ssds=$(ls {LOCAL_SSD_GLOB} | sort)
  members=""
  for d in $ssds; do if mdadm --examine "$d" >/dev/null 2>&1; then members="$members $d"; fi; done
  if [ -n "$members" ]; then
    mdadm --assemble {LOCAL_SSD_ARRAY} $ssds || {{ echo "gpufleet: the local SSDs carry an md array that does not assemble; not making a new one over its data" >&2; exit 1; }}
    udevadm settle --timeout=10 || true
    if ! blkid -L {LOCAL_SSD_LABEL} >/dev/null 2>&1; then
      if blkid -p {LOCAL_SSD_ARRAY} >/dev/null 2>&1; then echo "gpufleet: {LOCAL_SSD_ARRAY} holds a filesystem not labelled {LOCAL_SSD_LABEL}; not formatting it" >&2; exit 1; fi
      mkfs.ext4 -q -F -L {LOCAL_SSD_LABEL} {LOCAL_SSD_ARRAY}
    fi
  else
    mdadm --create {LOCAL_SSD_ARRAY} --run --force --level=0 --raid-devices={count} $ssds
    mkfs.ext4 -q -F -L {LOCAL_SSD_LABEL} {LOCAL_SSD_ARRAY}
  fi
fi
mkdir -p {LOCAL_SSD_MOUNT}
grep -q '^LABEL={LOCAL_SSD_LABEL} ' /etc/fstab || echo 'LABEL={LOCAL_SSD_LABEL} {LOCAL_SSD_MOUNT} ext4 discard,defaults,nofail 0 2' >> /etc/fstab
mountpoint -q {LOCAL_SSD_MOUNT} || mount {LOCAL_SSD_MOUNT}
mkdir -p /etc/systemd/system/nomad.service.d
printf '[Unit]\\nRequiresMountsFor={LOCAL_SSD_MOUNT}\\n' > /etc/systemd/system/nomad.service.d/gpufleet-localssd.conf
systemctl daemon-reload"""


def host_volumes(local_ssds: int) -> dict[str, dict[str, object]]:
    """The client's ``host_volume`` blocks (Nomad v1.10.5 command/agent/config.go:369 ClientConfig.HostVolumes,
    nomad/structs/volumes.go:30-33 ClientHostVolumeConfig: label, ``path``, ``read_only``); a job mounts it by name."""
    if not local_ssds:
        return {}
    return {f'host_volume "{LOCAL_SSD_VOLUME}"': {"path": LOCAL_SSD_MOUNT, "read_only": False}}


# --- DCGM exporter --------------------------------------------------------------------------------------
DCGM_EXPORTER_VERSION = "4.2.3-4.1.3"
# NVIDIA/dcgm-exporter at tag 4.2.3-4.1.3: README.md:14 runs this image. Pinned so that the counters
# gpufleet writes are checked against that tag's own default-counters.csv (vendored in the tests). The CUDA
# version of the base image does not gate the host's driver: every flavour of the exporter's Dockerfiles sets
# NVIDIA_DISABLE_REQUIRE=true (docker/Dockerfile, docker/Dockerfile.ubuntu22.04), so the container toolkit
# checks no CUDA requirement, and the exporter talks to the driver through DCGM/NVML only.
DCGM_EXPORTER_IMAGE = f"nvcr.io/nvidia/k8s/dcgm-exporter:{DCGM_EXPORTER_VERSION}-ubuntu22.04"
DCGM_EXPORTER_PORT = 9400
DCGM_EXPORTER_UNIT = "gpufleet-dcgm-exporter"
DCGM_COUNTERS_FILE = "/etc/gpufleet/dcgm-counters.csv"
# Upstream's default-counters.csv at 4.2.3-4.1.3 (every row it enables), plus the uncorrectable ECC count,
# which upstream leaves commented out and the health checker needs. tests/constructs_lib/vendor holds
# upstream's file; the test checks every row here against it (field, type).
DCGM_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
)


def counters_csv() -> str:
    return "".join(f"{field}, {kind}, {help_}\n" for field, kind, help_ in DCGM_COUNTERS)


def _unit_exporter() -> str:
    """The exporter as upstream's README runs it (``--gpus all --cap-add SYS_ADMIN -p 9400:9400``), with
    gpufleet's counters file (``-f``: pkg/cmd/app.go:111-117 at 4.2.3-4.1.3, flag ``collectors``)."""
    name = DCGM_EXPORTER_UNIT
    return f"""[Unit]
Description=NVIDIA DCGM exporter (gpufleet): GPU metrics on :{DCGM_EXPORTER_PORT}
After=docker.service
Requires=docker.service

[Service]
ExecStartPre=-/usr/bin/docker rm -f {name}
ExecStart=/usr/bin/docker run --rm --name {name} --gpus all --cap-add SYS_ADMIN -p {DCGM_EXPORTER_PORT}:{DCGM_EXPORTER_PORT} \\
  -v {DCGM_COUNTERS_FILE}:/etc/dcgm-exporter/gpufleet-counters.csv:ro {DCGM_EXPORTER_IMAGE} -f /etc/dcgm-exporter/gpufleet-counters.csv
ExecStop=/usr/bin/docker stop {name}
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""


# --- Health checker -------------------------------------------------------------------------------------
HEALTH_UNIT = "gpufleet-gpu-health"
HEALTH_SCRIPT = "/usr/local/bin/gpufleet-gpu-health"
HEALTH_ENV = "/etc/gpufleet/gpu-health.env"
HEALTH_INTERVAL = "1min"
HEALTH_POLICY = "gpufleet-gpu-health"
# node:write is what eligibility and drain need (nomad/node_endpoint.go:674 and :778 at v1.10.5,
# AllowNodeWrite); it also reads the node (GetNode: AllowNodeRead, :943). Nothing else.
HEALTH_RULES = 'node {\n  policy = "write"\n}\n'


def checker_source() -> str:
    return Path(nomad_gpu_health_check.__file__).read_text()


def render_telemetry_and_health(*, project: str, token_secret_id: str, nomad_addr: str, node_id_file: str,
                                ca_file: str, cert_file: str, key_file: str, expected_gpus: int) -> str:
    """Boot steps: the counters file, the exporter unit, the checker script with its environment and its
    minute timer. The checker's token stays in Secret Manager (read per run), never in these files."""
    env = {"GPUFLEET_PROJECT": project, "GPUFLEET_HEALTH_SECRET_NAME": token_secret_id, "GPUFLEET_NOMAD_ADDR": nomad_addr,
           "GPUFLEET_NODE_ID_FILE": node_id_file, "GPUFLEET_NOMAD_CA_FILE": ca_file, "GPUFLEET_NOMAD_CERT_FILE": cert_file,
           "GPUFLEET_NOMAD_KEY_FILE": key_file, "GPUFLEET_DCGM_URL": f"http://127.0.0.1:{DCGM_EXPORTER_PORT}/metrics",
           "GPUFLEET_EXPECTED_GPUS": str(expected_gpus)}
    service = f"""[Unit]
Description=gpufleet GPU health check: XID/ECC faults mark this Nomad node ineligible and drain it
After=nomad.service {DCGM_EXPORTER_UNIT}.service

[Service]
Type=oneshot
EnvironmentFile={HEALTH_ENV}
ExecStart=/usr/bin/python3 {HEALTH_SCRIPT}
"""
    timer = f"""[Unit]
Description=Run the gpufleet GPU health check every {HEALTH_INTERVAL}

[Timer]
OnBootSec=5min
OnUnitActiveSec={HEALTH_INTERVAL}

[Install]
WantedBy=timers.target
"""
    return "\n".join([
        "# GPU telemetry (DCGM exporter) and the health checker, both ahead of Nomad.",
        "mkdir -p /etc/gpufleet",
        f"cat > {DCGM_COUNTERS_FILE} <<'GPUFLEET_DCGM_COUNTERS'\n{counters_csv()}GPUFLEET_DCGM_COUNTERS",
        f"cat > /etc/systemd/system/{DCGM_EXPORTER_UNIT}.service <<'GPUFLEET_UNIT'\n{_unit_exporter()}GPUFLEET_UNIT",
        f"cat > {HEALTH_SCRIPT} <<'GPUFLEET_HEALTH_SCRIPT'\n{checker_source()}GPUFLEET_HEALTH_SCRIPT",
        f"chmod 755 {HEALTH_SCRIPT}",
        f"cat > {HEALTH_ENV} <<'GPUFLEET_HEALTH_ENV'\n" + "".join(f"{k}={v}\n" for k, v in env.items()) + "GPUFLEET_HEALTH_ENV",
        f"cat > /etc/systemd/system/{HEALTH_UNIT}.service <<'GPUFLEET_UNIT'\n{service}GPUFLEET_UNIT",
        f"cat > /etc/systemd/system/{HEALTH_UNIT}.timer <<'GPUFLEET_UNIT'\n{timer}GPUFLEET_UNIT",
        "systemctl daemon-reload",
        f"systemctl enable {DCGM_EXPORTER_UNIT}.service {HEALTH_UNIT}.timer",
        f"systemctl restart {DCGM_EXPORTER_UNIT}.service",
        f"systemctl start {HEALTH_UNIT}.timer",
    ])


def render_gpu_scrape_config(*, cluster: str, project: str, zones: tuple[str, ...], client_tag: str) -> dict[str, object]:
    """The Prometheus job for the clients' DCGM exporters (``gpufleet nomad scrape-config`` prints it after
    the servers' job): GCE discovery in every zone a GPU pool runs in, kept by the clients' network tag, the
    exporter's plain-HTTP port, which the firewall opens to ``nomad.autoscaler.scrape_cidrs`` only."""
    return {"job_name": f"nomad-gpu-clients-{cluster}", "scheme": "http", "metrics_path": "/metrics",
            "gce_sd_configs": [{"project": project, "zone": zone, "port": DCGM_EXPORTER_PORT} for zone in zones],
            "relabel_configs": [{"source_labels": ["__meta_gce_tags"], "regex": f".*,{client_tag},.*", "action": "keep"},
                                {"source_labels": ["__meta_gce_instance_name"], "target_label": "instance"},
                                {"source_labels": ["__meta_gce_zone"], "regex": ".*/zones/(.+)", "target_label": "zone"}]}
