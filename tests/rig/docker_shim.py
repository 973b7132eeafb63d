"""`docker` stand-in for the rig hosts: records every call, runs enginesim where the real image would run.

Installed by the rig into each host's bin dir (first on PATH for SSH sessions) behind a small `docker`
wrapper that sets QM_SHIM_HOME (per-host container state), QM_SHIM_CALLS (the per-host
docker_calls.jsonl) and QM_SHIM_PYTHON (the project's venv python, which has enginesim installed).
Standard library only: it is a file on the "node", not part of the test process.

The calibration (roles/calibrate) runs `python3 <dir>/calibrate.pyz --device cuda ...` in the image with
`--gpus device=N`; there is no GPU here, so the shim stands in for one: it replays the H200 measurement
that ships inside that zipapp (enginesim/data/measured/h200/raw.json) through the zipapp's own profile
builder, and writes raw.json/profile.json where the real program would. Every replayed file says so
(`environment.rig_shim`). TEST-ONLY HOOK: `<QM_SHIM_HOME>/gpu_plant.json`, e.g.
`{"5": {"bandwidth": 0.8, "gemm": 1.0}}`, scales GPU 5's replayed figures (a planted slow GPU). Nothing
outside tests/rig reads that file; production code has no such hook.

Implemented: `docker version`, `docker run [-d] --name N [opts] IMAGE CMD...`, `docker logs [--tail N] N`,
`docker inspect [-f FMT] N`, `docker ps [-a] [-q] [--filter name=|status=] [--format FMT]`,
`docker rm [-f] N`, `docker stop [-t S] N`, `docker kill N`, `docker image inspect IMAGE`
(an emulated image: id = hash of the reference). An image tag's version (`:v0.5.6-cu129`) becomes
ENGINESIM_ENGINE_VERSION in the container, and `python3 -m pip show sglang` / `vllm --version` there
print the emulated version, so preflight's flag check reads the emulated version's own `--help`.
As real vLLM 0.11.2 does, `vllm ...` in a container started without `--gpus` exits 1 with "Failed to
infer device type" (its server parser cannot pick a device where no GPU is visible).
Anything else exits 125 with a message, so a role that starts to depend on another docker feature
fails loudly on the rig instead of passing.
Options that the real CLI validates against the host (a `--device` path that does not exist, a name
already in use) fail here the same way, with the real CLI's message and exit code 125.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

SHIM_VERSION = "27.3.1-qmrig"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# `docker run` options that take a value (long and short spellings), and the boolean ones.
VALUE_OPTS = {
    "--name", "-e", "--env", "--env-file", "--device", "--shm-size", "--network", "--net", "--ipc",
    "-v", "--volume", "--mount", "--ulimit", "--cap-add", "--cap-drop", "--gpus", "--entrypoint",
    "-w", "--workdir", "-u", "--user", "--label", "-l", "--restart", "--security-opt", "--pid",
    "-h", "--hostname", "--memory", "-m", "--cpus", "--log-driver", "--log-opt", "--add-host",
    "--tmpfs", "-p", "--publish", "--stop-signal", "--stop-timeout", "--runtime", "--pull",
    "--platform", "--group-add", "--device-cgroup-rule", "--sysctl", "--cgroupns", "--uts", "--userns",
}  # fmt: skip
FLAG_OPTS = {"--detach", "--rm", "--interactive", "--tty", "--privileged", "--init", "--read-only"}
SHORT_FLAGS = set("ditP")


class ShimError(Exception):
    """A docker error: message for stderr and the exit code the real CLI uses."""

    def __init__(self, message: str, code: int = 125) -> None:
        super().__init__(message)
        self.code = code


def now_iso() -> str:
    """Docker-style RFC 3339 timestamp in UTC."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def home() -> Path:
    """The per-host container state directory."""
    return Path(os.environ.get("QM_SHIM_HOME", str(Path(__file__).resolve().parent.parent / "docker")))


def record_call(argv: list[str]) -> None:
    """Append one JSON line {time, argv, pid, host} to the per-host docker_calls.jsonl (one write call)."""
    calls = os.environ.get("QM_SHIM_CALLS", str(home().parent / "docker_calls.jsonl"))
    line = json.dumps(
        {
            "time": time.time(),
            "argv": ["docker", *argv],
            "pid": os.getpid(),
            "host": os.environ.get("QM_RIG_HOST"),
        }
    )
    fd = os.open(calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def write_json(path: Path, data: object) -> None:
    """Atomic write: temp file in the same directory, then rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def container_dir(name: str) -> Path:
    """Where one container's state.json and log live."""
    return home() / "containers" / name


def load_state(ref: str) -> dict:
    """State of the container named `ref` (or whose id starts with `ref`); raise when there is none."""
    direct = container_dir(ref) / "state.json"
    if direct.exists():
        return json.loads(direct.read_text())
    root = home() / "containers"
    if root.exists() and len(ref) >= 3:
        for state_file in root.glob("*/state.json"):
            state = json.loads(state_file.read_text())
            if state["id"].startswith(ref):
                return state
    raise ShimError(f"Error response from daemon: No such container: {ref}", 1)


def all_states() -> list[dict]:
    """Every container this host knows (running or exited), oldest first."""
    root = home() / "containers"
    states = [json.loads(p.read_text()) for p in root.glob("*/state.json")] if root.exists() else []
    return sorted(states, key=lambda s: s["created"])


def pid_alive(pid: int | None) -> bool:
    """True when `pid` runs and is not a zombie."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def refresh(state: dict) -> dict:
    """Mark a container whose engine died without its supervisor noticing (e.g. both killed) as exited."""
    if (
        state["status"] == "running"
        and not pid_alive(state.get("pid"))
        and not pid_alive(state.get("supervisor_pid"))
    ):
        state.update(
            status="exited",
            exit_code=state.get("exit_code") or 137,
            finished=state.get("finished") or now_iso(),
        )
    return state


# ---------------------------------------------------------------------------------------------- run


def parse_run(argv: list[str]) -> dict:
    """Split `docker run` argv into options, image and command; raise ShimError on an unknown flag."""
    opts: dict[str, list[str]] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            break
        if arg == "--":
            i += 1
            break
        key, eq, inline = arg.partition("=")
        if key in VALUE_OPTS:
            if eq:
                value = inline
            else:
                if i + 1 >= len(argv):
                    raise ShimError(f'flag needs an argument: "{key}" in run')
                i += 1
                value = argv[i]
            opts.setdefault(key, []).append(value)
        elif arg in FLAG_OPTS:
            flags.add(arg)
        elif re.fullmatch(r"-[a-zA-Z]+", arg) and set(arg[1:]) <= SHORT_FLAGS:
            flags.update(f"-{c}" for c in arg[1:])
        else:
            raise ShimError(f"unknown flag: {key}\nSee 'docker run --help'.")
        i += 1
    if i >= len(argv):
        raise ShimError('"docker run" requires at least 1 argument.')
    return {"opts": opts, "flags": flags, "image": argv[i], "cmd": argv[i + 1 :]}


def image_engine_version(image: str) -> str | None:
    """The engine version an image tag names (`lmsysorg/sglang:v0.5.6-cu129` -> 0.5.6); None = untagged.

    The emulated image is enginesim at that version (ENGINESIM_ENGINE_VERSION): its --help and its
    argument parser are that version's, and enginesim refuses a version it does not emulate.
    """
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    m = re.match(r"v?(\d+\.\d+\.\d+)", tag)
    return m.group(1) if m else None


def image_doc(image: str) -> dict:
    """`docker image inspect` of an emulated image: its id is a hash of the reference (no real layers)."""
    import hashlib

    return {
        "Id": "sha256:" + hashlib.sha256(image.encode()).hexdigest(),
        "RepoTags": [image],
        "RepoDigests": [],
        "Config": {"Labels": {"quickmap.rig_shim": "emulated image: enginesim stands in for the engine"}},
    }


def cmd_image(argv: list[str]) -> int:
    """`docker image inspect IMAGE...`: every image 'exists' (the shim has no registry)."""
    if not argv or argv[0] != "inspect":
        raise ShimError(f"rig shim: docker image {' '.join(argv[:1])} is not supported", 125)
    refs = [a for a in argv[1:] if not a.startswith("-")]
    print(json.dumps([image_doc(r) for r in refs], indent=4))
    return 0


def container_env(opts: dict[str, list[str]], hostname: str, image: str = "") -> dict[str, str]:
    """The container's environment: image defaults plus `--env-file` and `-e K=V` / `-e K` (from our env)."""
    env = {"PATH": CONTAINER_PATH, "HOME": "/root", "HOSTNAME": hostname, "LC_ALL": "C.UTF-8"}
    version = image_engine_version(image)
    if version:
        env["ENGINESIM_ENGINE_VERSION"] = version
    entries: list[str] = []
    for env_file in opts.get("--env-file", []):
        for line in Path(env_file).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                entries.append(line.strip())
    entries += opts.get("-e", []) + opts.get("--env", [])
    for entry in entries:
        key, eq, value = entry.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    return env


def engine_argv(cmd: list[str]) -> list[str]:
    """Map the image command onto enginesim: SGLang's launcher or `vllm serve`, nothing else."""
    python = os.environ.get("QM_SHIM_PYTHON", sys.executable)
    if (
        len(cmd) >= 3
        and Path(cmd[0]).name.startswith("python")
        and cmd[1:3] == ["-m", "sglang.launch_server"]
    ):
        return [python, "-m", "enginesim", "sglang", *cmd[3:]]
    if len(cmd) >= 2 and cmd[:2] == ["vllm", "serve"]:
        return [python, "-m", "enginesim", "vllm", "serve", *cmd[2:]]
    if cmd == ["vllm", "--version"]:
        return [python, "-m", "enginesim", "vllm", "--sim-print-version"]
    if (
        len(cmd) == 5
        and Path(cmd[0]).name.startswith("python")
        and cmd[1:4] == ["-m", "pip", "show"]
        and cmd[4] in ("sglang", "vllm")
    ):
        return [python, "-S", os.path.abspath(__file__), "__pip_show", cmd[4]]
    shown = shlex.join(cmd) if cmd else "(image default)"
    raise ShimError(
        "docker: Error response from daemon: rig shim runs only `python3 -m sglang.launch_server ...` "
        f"or `vllm serve ...`, got: {shown}",
        127,
    )


def _mounts(opts: dict[str, list[str]]) -> list[tuple[str, str, bool]]:
    """(host path, container path, writable) of every `-v`/`--volume` bind mount."""
    out = []
    for spec in opts.get("-v", []) + opts.get("--volume", []):
        parts = spec.split(":")
        if len(parts) >= 2:
            out.append((parts[0], parts[1], not (len(parts) > 2 and "ro" in parts[2].split(","))))
    return out


def _inside(path: str, mounts: list[tuple[str, str, bool]], writable: bool) -> bool:
    """True when `path` (a container path) lies in a bind mount whose host path is the same directory.

    The shim has no mount namespace: it runs the command on the host, so only same-path mounts (what
    roles/calibrate uses) behave as in the real container; any other path would not exist in there.
    """
    for host, cont, rw in mounts:
        if (
            host == cont
            and (path == cont or path.startswith(cont.rstrip("/") + "/"))
            and (rw or not writable)
        ):
            return True
    return False


def is_calibration(cmd: list[str]) -> bool:
    """`python3 .../calibrate.pyz ...`: the command roles/calibrate runs in the engine image."""
    return len(cmd) >= 2 and Path(cmd[0]).name.startswith("python") and cmd[1].endswith("calibrate.pyz")


def is_client(cmd: list[str]) -> bool:
    """`python3 .../loadgen.pyz ...`: the client run in a container (bench_client_runtime=docker)."""
    return len(cmd) >= 2 and Path(cmd[0]).name.startswith("python") and cmd[1].endswith("loadgen.pyz")


def _vllm_without_gpu() -> list[str]:
    """What vLLM 0.11.2 does in a container that sees no GPU: `vllm serve` (its --help included) and
    `vllm --version` build the server's argument parser, whose device config cannot infer a device
    (checked with the real vllm 0.11.2 wheel on a box without a GPU). `vllm bench` alone switches to
    the CPU platform."""
    python = os.environ.get("QM_SHIM_PYTHON", sys.executable)
    msg = (
        "RuntimeError: Failed to infer device type, please set the environment variable "
        "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue."
    )
    return [python, "-S", os.path.abspath(__file__), "__exit", "1", msg]


def container_argv(parsed: dict) -> list[str]:
    """The host command that stands in for the container's: enginesim for an engine, a GPU replay for
    the calibration (after the checks the real container would fail: the zipapp and --out must be in
    bind mounts, --out writable), the client zipapp itself for the benchmark client (it needs only
    Python and httpx, which the venv python has; the zipapp and the working dir must be mounted)."""
    cmd = parsed["cmd"]
    if is_client(cmd):
        mounts = _mounts(parsed["opts"])
        python = os.environ.get("QM_SHIM_PYTHON", sys.executable)
        fail = [python, "-S", os.path.abspath(__file__), "__exit", "2"]
        if not _inside(cmd[1], mounts, writable=False):
            return [*fail, f"{cmd[0]}: can't open file '{cmd[1]}': [Errno 2] No such file or directory"]
        workdir = (parsed["opts"].get("-w") or parsed["opts"].get("--workdir") or [""])[-1]
        if workdir and not _inside(workdir, mounts, writable=True):
            return [*fail, f"rig shim: -w {workdir} is not in a writable bind mount of the container"]
        return [python, *cmd[1:]]
    if not is_calibration(cmd):
        if cmd[:1] == ["vllm"] and not parsed["opts"].get("--gpus"):
            return _vllm_without_gpu()
        return engine_argv(cmd)
    mounts = _mounts(parsed["opts"])
    python = os.environ.get("QM_SHIM_PYTHON", sys.executable)
    fail = [python, "-S", os.path.abspath(__file__), "__exit", "2"]
    if not _inside(cmd[1], mounts, writable=False):
        return [*fail, f"{cmd[0]}: can't open file '{cmd[1]}': [Errno 2] No such file or directory"]
    out = cmd[cmd.index("--out") + 1] if "--out" in cmd[:-1] else ""
    if out and not _inside(out, mounts, writable=True):
        return [*fail, f"rig shim: --out {out} is not in a writable bind mount of the container"]
    gpus = (parsed["opts"].get("--gpus") or [""])[-1]
    return [python, "-S", os.path.abspath(__file__), "__gpu_calibration", gpus, str(home()), *cmd[1:]]


def cmd_run(argv: list[str]) -> int:
    """`docker run`: validate like the daemon, then start a supervisor that runs the engine."""
    parsed = parse_run(argv)
    opts, flags = parsed["opts"], parsed["flags"]
    names = opts.get("--name", [])
    name = names[-1] if names else f"qmrig_{secrets.token_hex(4)}"
    cid = secrets.token_hex(32)
    cdir = container_dir(name)
    if (cdir / "state.json").exists():
        other = json.loads((cdir / "state.json").read_text())["id"]
        raise ShimError(
            f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use '
            f'by container "{other}". You have to remove (or rename) that container to be able to reuse '
            "that name."
        )
    devices = []
    for spec in opts.get("--device", []):
        host_path = spec.split(":", 1)[0]
        if not os.path.exists(host_path):
            raise ShimError(
                "docker: Error response from daemon: error gathering device information while adding custom "
                f'device "{host_path}": no such file or directory.'
            )
        parts = spec.split(":")
        devices.append(
            {
                "PathOnHost": host_path,
                "PathInContainer": parts[1] if len(parts) > 1 and parts[1] else host_path,
                "CgroupPermissions": parts[2] if len(parts) > 2 else "rwm",
            }
        )
    hostname = (opts.get("-h") or opts.get("--hostname") or [os.uname().nodename])[-1]
    engine = container_argv(parsed)
    cdir.mkdir(parents=True)
    state = {
        "id": cid,
        "name": name,
        "image": parsed["image"],
        "cmd": parsed["cmd"],
        "engine_argv": engine,
        "env": container_env(opts, hostname, parsed["image"]),
        "devices": devices,
        "opts": opts,
        "flags": sorted(flags),
        "created": now_iso(),
        "started": None,
        "finished": None,
        "status": "created",
        "pid": None,
        "supervisor_pid": None,
        "exit_code": None,
        "log": str(cdir / "container.log"),
        "docker_argv": ["docker", "run", *argv],
    }
    write_json(cdir / "state.json", state)
    sup = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "__supervise", name],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = json.loads((cdir / "state.json").read_text())
        if state["pid"]:
            break
        if sup.poll() is not None:
            raise ShimError(f"docker: Error response from daemon: failed to start container {name}", 125)
        time.sleep(0.02)
    else:
        raise ShimError(f"docker: Error response from daemon: container {name} did not start in 10 s", 125)
    if "-d" in flags or "--detach" in flags:
        print(cid, flush=True)
        return 0
    sup.wait()
    state = json.loads((cdir / "state.json").read_text())
    sys.stdout.write(Path(state["log"]).read_text(errors="replace"))
    if "--rm" in flags:
        removed = home() / "removed"
        removed.mkdir(parents=True, exist_ok=True)
        os.replace(cdir, removed / f"{name}-{time.time_ns()}")
    return int(state["exit_code"] or 0)


def pip_show(package: str) -> int:
    """`python3 -m pip show sglang|vllm` in the emulated image: the version enginesim emulates there."""
    python = os.environ.get("QM_SHIM_PYTHON", sys.executable)
    flavour = ["sglang"] if package == "sglang" else ["vllm"]
    out = subprocess.run(
        [python, "-m", "enginesim", *flavour, "--sim-print-version"], capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        return out.returncode
    print(
        f"Name: {package}\nVersion: {out.stdout.strip()}\nSummary: emulated by enginesim (quickmap rig shim)"
    )
    return 0


def supervise(name: str) -> int:
    """Run the engine as the container's main process; record its PID, then its exit code."""
    state_file = container_dir(name) / "state.json"
    state = json.loads(state_file.read_text())
    with open(state["log"], "ab") as log:
        proc = subprocess.Popen(
            state["engine_argv"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=state["env"],
            cwd=(state["opts"].get("-w") or state["opts"].get("--workdir") or ["/"])[-1],
            start_new_session=True,
        )
    state.update(pid=proc.pid, supervisor_pid=os.getpid(), status="running", started=now_iso())
    write_json(state_file, state)
    pids_file = home() / "pids.jsonl"
    with open(pids_file, "a") as fh:
        rec = {"name": name, "pid": proc.pid, "supervisor_pid": os.getpid()}
        rec.update(pid_start=start_ticks(proc.pid), supervisor_start=start_ticks(os.getpid()))
        fh.write(json.dumps(rec) + "\n")
    signal.signal(signal.SIGTERM, lambda *_: None)  # the engine's exit, not ours, ends the container
    code = proc.wait()
    state = json.loads(state_file.read_text())
    state.update(status="exited", exit_code=128 - code if code < 0 else code, finished=now_iso())
    write_json(state_file, state)
    return 0


# ---------------------------------------------------------------------------------------- formatting


def go_field(data: object, path: str) -> object:
    """Walk `.A.B` through nested dicts the way a Go template does."""
    value = data
    for part in [p for p in path.split(".") if p]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def go_str(value: object) -> str:
    """Go's default printing of a value (booleans lower case, nil as <no value>)."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_str(v)}" for k, v in value.items()) + "]"
    return str(value)


def render(fmt: str, data: dict) -> str:
    """A Go-template subset: `{{.A.B}}` and `{{json .A}}` (all docker's --format uses the roles need)."""
    if fmt == "json" or fmt == "{{json .}}":
        return json.dumps(data)

    def one(match: re.Match[str]) -> str:
        expr = match.group(1).strip()
        if expr.startswith("json "):
            return json.dumps(go_field(data, expr[5:].strip()))
        if expr.startswith("."):
            return go_str(go_field(data, expr))
        raise ShimError(f"template: unsupported expression {{{{{expr}}}}} in rig shim", 1)

    return re.sub(r"\{\{(.*?)\}\}", one, fmt.replace("\\t", "\t").replace("\\n", "\n"))


def human_age(iso: str | None) -> str:
    """Docker's `Up 5 seconds` style durations."""
    if not iso:
        return "Less than a second"
    then = datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    secs = int((datetime.now(UTC) - then).total_seconds())
    if secs < 1:
        return "Less than a second"
    if secs < 60:
        return f"{secs} seconds"
    if secs < 120:
        return "About a minute"
    if secs < 3600:
        return f"{secs // 60} minutes"
    return f"{secs // 3600} hours"


def status_text(state: dict) -> str:
    """The STATUS column of `docker ps`."""
    if state["status"] == "running":
        return f"Up {human_age(state['started'])}"
    if state["status"] == "exited":
        return f"Exited ({state['exit_code']}) {human_age(state['finished'])} ago"
    return "Created"


def inspect_doc(state: dict) -> dict:
    """`docker inspect` JSON built from the shim state (the fields the evidence and the roles read)."""
    running = state["status"] == "running"
    opts = state["opts"]
    return {
        "Id": state["id"],
        "Created": state["created"],
        "Path": state["cmd"][0] if state["cmd"] else "",
        "Args": state["cmd"][1:],
        "State": {
            "Status": state["status"],
            "Running": running,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": state["pid"] if running else 0,
            "ExitCode": state["exit_code"] or 0,
            "Error": "",
            "StartedAt": state["started"] or "0001-01-01T00:00:00Z",
            "FinishedAt": state["finished"] or "0001-01-01T00:00:00Z",
        },
        "Name": "/" + state["name"],
        "LogPath": state["log"],
        "HostConfig": {
            "NetworkMode": (opts.get("--network") or opts.get("--net") or ["bridge"])[-1],
            "IpcMode": (opts.get("--ipc") or ["private"])[-1],
            "ShmSize": (opts.get("--shm-size") or ["64m"])[-1],
            "Privileged": "--privileged" in state["flags"],
            "Devices": state["devices"],
            "Binds": opts.get("-v", []) + opts.get("--volume", []),
            "Ulimits": opts.get("--ulimit", []),
            "CapAdd": opts.get("--cap-add", []),
        },
        "Config": {
            "Hostname": state["env"].get("HOSTNAME", ""),
            "Env": [f"{k}={v}" for k, v in state["env"].items()],
            "Cmd": state["cmd"],
            "Image": state["image"],
            "Entrypoint": None,
        },
        "Rig": {"engine_argv": state["engine_argv"], "docker_argv": state["docker_argv"]},
    }


# ------------------------------------------------------------------------------------ other commands


def cmd_version(argv: list[str]) -> int:
    """`docker version [--format FMT]`."""
    doc = {
        "Client": {"Version": SHIM_VERSION, "ApiVersion": "1.47", "Os": "linux"},
        "Server": {"Version": SHIM_VERSION, "ApiVersion": "1.47", "Os": "linux"},
    }
    fmt = _opt(argv, "--format", "-f")
    if fmt:
        print(render(fmt, doc))
    else:
        print(f"Client:\n Version:           {SHIM_VERSION}\n API version:       1.47")
        print(f"\nServer: quickmap rig shim\n Engine:\n  Version:          {SHIM_VERSION}")
    return 0


def _opt(argv: list[str], *names: str) -> str | None:
    """Value of the last `--opt V` / `--opt=V` among `names` in argv."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def _positionals(argv: list[str], value_opts: set[str]) -> list[str]:
    """Arguments that are neither options nor option values."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in value_opts:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def cmd_logs(argv: list[str]) -> int:
    """`docker logs [--tail N] NAME`: the container's combined output."""
    known = {"--tail", "-n", "--since", "--until"}
    for arg in argv:
        if arg.startswith("-") and arg.split("=")[0] not in known | {"--timestamps", "-t"}:
            raise ShimError(f"unknown flag: {arg}")
    refs = _positionals(argv, known)
    if len(refs) != 1:
        raise ShimError('"docker logs" requires exactly 1 argument.', 1)
    state = load_state(refs[0])
    text = Path(state["log"]).read_text(errors="replace") if Path(state["log"]).exists() else ""
    tail = _opt(argv, "--tail", "-n")
    if tail and tail != "all":
        text = "".join(text.splitlines(keepends=True)[-int(tail) :])
    sys.stdout.write(text)
    return 0


def cmd_inspect(argv: list[str]) -> int:
    """`docker inspect [-f FMT] NAME...`: exit 1 with `No such object` for unknown names (like docker)."""
    fmt = _opt(argv, "--format", "-f")
    refs = _positionals(argv, {"--format", "-f", "--type"})
    docs, missing = [], []
    for ref in refs:
        try:
            docs.append(inspect_doc(refresh(load_state(ref))))
        except ShimError:
            missing.append(ref)
    if fmt:
        for doc in docs:
            print(render(fmt, doc))
    else:
        print(json.dumps(docs, indent=4))
    for ref in missing:
        print(f"Error: No such object: {ref}", file=sys.stderr)
    return 1 if missing else 0


def cmd_ps(argv: list[str]) -> int:
    """`docker ps [-a] [-q] [--filter name=RE|status=S] [--format FMT]` (name filter is a regex search)."""
    show_all = any(a in ("-a", "--all") for a in argv)
    quiet = any(a in ("-q", "--quiet") for a in argv)
    fmt = _opt(argv, "--format")
    filters = [argv[i + 1] for i, a in enumerate(argv) if a in ("--filter", "-f") and i + 1 < len(argv)]
    filters += [a.split("=", 1)[1] for a in argv if a.startswith("--filter=")]
    rows = []
    for state in map(refresh, all_states()):
        if not show_all and state["status"] != "running":
            continue
        ok = True
        for flt in filters:
            key, _, value = flt.partition("=")
            if key == "name":
                ok &= re.search(value.lstrip("/"), state["name"]) is not None
            elif key == "status":
                ok &= state["status"] == value
            elif key == "id":
                ok &= state["id"].startswith(value)
            else:
                raise ShimError(f"rig shim: unsupported filter {flt}", 1)
        if ok:
            rows.append(state)
    for state in rows:
        fields = {
            "ID": state["id"][:12],
            "Names": state["name"],
            "Image": state["image"],
            "Status": status_text(state),
            "State": state["status"],
            "Command": '"' + shlex.join(state["cmd"])[:20] + '…"',
            "CreatedAt": state["created"],
        }
        if quiet:
            print(fields["ID"])
        elif fmt:
            print(render(fmt, fields))
        else:
            print(f"{fields['ID']}   {fields['Image']}   {fields['Status']}   {fields['Names']}")
    return 0


def _signal_engine(state: dict, sig: int) -> None:
    """Signal the engine's process group (it is its own session leader), falling back to the PID."""
    pid = state.get("pid")
    if not pid_alive(pid):
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _stop(state: dict, grace_s: float) -> None:
    """TERM the engine, wait up to `grace_s`, then KILL; wait for the supervisor to record the exit."""
    _signal_engine(state, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(state.get("pid")):
        time.sleep(0.05)
    _signal_engine(state, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pid_alive(state.get("supervisor_pid")):
        time.sleep(0.05)


def cmd_stop(argv: list[str]) -> int:
    """`docker stop [-t S] NAME...`."""
    grace = float(_opt(argv, "-t", "--time", "--timeout") or 10)
    for ref in _positionals(argv, {"-t", "--time", "--timeout"}):
        _stop(load_state(ref), grace)
        print(ref)
    return 0


def cmd_kill(argv: list[str]) -> int:
    """`docker kill NAME...` (SIGKILL)."""
    for ref in _positionals(argv, {"-s", "--signal"}):
        state = load_state(ref)
        if state["status"] != "running" or not pid_alive(state.get("pid")):
            raise ShimError(
                f"Error response from daemon: cannot kill container: {ref}: container is not running", 1
            )
        _stop(state, 0)
        print(ref)
    return 0


def cmd_rm(argv: list[str]) -> int:
    """`docker rm [-f] NAME...`: -f stops a running container (TERM, then KILL) before removing it."""
    force = any(a in ("-f", "--force") for a in argv)
    code = 0
    for ref in _positionals(argv, set()):
        try:
            state = refresh(load_state(ref))
        except ShimError as err:
            print(str(err), file=sys.stderr)
            code = 1
            continue
        if state["status"] == "running":
            if not force:
                print(
                    f'Error response from daemon: cannot remove container "/{state["name"]}": container is '
                    "running: stop the container before removing or force remove",
                    file=sys.stderr,
                )
                code = 1
                continue
            _stop(state, 5.0)
        # The real daemon deletes the container; the rig keeps it aside for the tests' evidence checks.
        removed = home() / "removed"
        removed.mkdir(parents=True, exist_ok=True)
        os.replace(container_dir(state["name"]), removed / f"{state['name']}-{time.time_ns()}")
        print(ref)
    return code


COMMANDS = {
    "version": cmd_version,
    "run": cmd_run,
    "logs": cmd_logs,
    "inspect": cmd_inspect,
    "ps": cmd_ps,
    "rm": cmd_rm,
    "stop": cmd_stop,
    "kill": cmd_kill,
    "image": cmd_image,
}


# ------------------------------------------------------------------- GPU calibration stand-in


def _scale(node: object, factor: float) -> object:
    """A section's figures as if the device were `factor` times as fast: times / factor, rates * factor."""
    if isinstance(node, list):
        return [_scale(v, factor) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for key, value in node.items():
        if key in ("bytes_per_s", "flops_per_s") and isinstance(value, (int, float)):
            out[key] = value * factor
        elif key == "samples_s" and isinstance(value, list):
            out[key] = [v / factor for v in value]
        elif key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value / factor
        else:
            out[key] = _scale(value, factor)
    return out


def gpu_calibration(gpus: str, shim_home: str, argv: list[str]) -> int:
    """Stand in for `python3 calibrate.pyz ARGS` on a GPU: replay the H200 measurement the zipapp carries.

    The zipapp's own argument checks, profile builder and atomic writes run (imported from the zipapp);
    only the measuring is replaced. `--gpus device=N` decides what "CUDA" sees, as in the container.
    """
    pyz = argv[0]
    sys.path.insert(0, pyz)
    import enginesim
    from enginesim.calibrate import __main__ as calmain
    from enginesim.calibrate import profile as calprofile

    if not os.path.abspath(enginesim.__file__).startswith(os.path.abspath(pyz)):
        print(f"rig shim: enginesim imported from {enginesim.__file__}, not from {pyz}", file=sys.stderr)
        return 3
    ns = calmain.parse_args(argv[1:])
    spec = gpus.strip("'\"")
    visible = (
        [str(i) for i in range(8)]
        if spec == "all"
        else spec.removeprefix("device=").split(",")
        if spec
        else []
    )
    if ns.device == "cuda" and not visible:
        print("python -m enginesim.calibrate: error: --device cuda: no CUDA device visible", file=sys.stderr)
        return 2
    if ns.device == "cpu":
        print(
            "rig shim: the stand-in replays a GPU; run the CPU path with the process runtime", file=sys.stderr
        )
        return 2
    if ns.gpu >= len(visible):
        print(f"python -m enginesim.calibrate: error: --gpu {ns.gpu}: only {len(visible)} CUDA device(s)",
              file=sys.stderr)  # fmt: skip
        return 2
    physical = visible[ns.gpu]
    plant_file = Path(shim_home) / "gpu_plant.json"
    plant = json.loads(plant_file.read_text()).get(physical, {}) if plant_file.exists() else {}
    from importlib import resources

    raw = json.loads(
        resources.files("enginesim").joinpath("data", "measured", "h200", "raw.json").read_text()
    )
    raw["sections"] = {k: v for k, v in raw["sections"].items() if k in ns.sections}
    raw["errors"] = {}
    for section, factor_key in (("bandwidth", "bandwidth"), ("gemm", "gemm")):
        factor = float(plant.get(factor_key, 1.0))
        if section in raw["sections"] and factor != 1.0:
            raw["sections"][section] = _scale(raw["sections"][section], factor)
    raw["command"] = ["python3", *argv]
    raw["started_utc"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    raw["env"]["host"] = os.uname().nodename
    raw["env"]["rig_shim"] = (
        f"quickmap rig docker shim: no GPU ran; replayed the H200 measurement shipped in {pyz} for physical "
        f"GPU {physical}" + (f", scaled by the test-only plant file {plant_file}: {plant}" if plant else "")
    )
    os.makedirs(ns.out, exist_ok=True)
    raw_text = calprofile.dumps(raw)
    for name in ns.sections:
        print(f"[calibrate] {name} ... (replayed)", flush=True)
    calprofile.write_atomic(os.path.join(ns.out, "raw.json"), raw_text)
    doc = calprofile.build(raw, ns.base or calprofile.base_for(raw["env"]["device_name"]) or "h200", ns.key)
    doc["raw_sha256"] = calprofile.sha256(raw_text)
    calprofile.write_atomic(os.path.join(ns.out, "profile.json"), calprofile.dumps(doc))
    print(calmain.summary_table(raw, doc), flush=True)
    return 0


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` (stat field 22): with the PID it names one process, even after PIDs wrap."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def main(argv: list[str]) -> int:
    """Entry point: record the call, then dispatch."""
    if argv[:1] == ["__supervise"]:
        return supervise(argv[1])
    if argv[:1] == ["__pip_show"]:
        return pip_show(argv[1])
    if argv[:1] == ["__gpu_calibration"]:
        return gpu_calibration(argv[1], argv[2], argv[3:])
    if argv[:1] == ["__exit"]:  # a container whose command fails at once (message on stderr)
        print(argv[2], file=sys.stderr)
        return int(argv[1])
    home().mkdir(parents=True, exist_ok=True)
    record_call(argv)
    args = [a for a in argv]
    if args and args[0] == "container" and len(args) > 1:  # `docker container inspect` etc.
        args = args[1:]
    if not args or args[0] not in COMMANDS:
        print(
            f"docker: '{args[0] if args else ''}' is not a docker command supported by the rig shim.",
            file=sys.stderr,
        )
        return 125
    try:
        return COMMANDS[args[0]](args[1:])
    except ShimError as err:
        print(str(err), file=sys.stderr)
        return err.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
