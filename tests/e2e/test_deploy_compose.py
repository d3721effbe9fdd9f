"""compose.test.yml: the box's services in containers from deploy/docker/Dockerfile, sharing the
run dir as a volume.

The file is always validated: `docker compose config` when the Compose CLI is there, and a
structure check here in any case. With a Docker engine the services are run with the Docker SDK
(the image built, the volumes made, each container started as the file says) and the controller
is called through the shared run dir. Without one the test skips, naming why; under CI=true (where
a skip fails the run and no engine runs) it asserts instead that no engine is reachable.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = CHECKOUT / "compose.test.yml"
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets"}
SERVICE_KEYS = {
    "build", "image", "command", "user", "environment", "volumes", "read_only", "tmpfs",
    "cap_drop", "cap_add", "security_opt", "privileged", "depends_on", "healthcheck",
}  # fmt: skip
RUN_DIR = "/run/lnk"
READY_SOCKETS = {  # what each service listens on once ready, under the run dir
    "proxy": "proxy/admin.sock",
    "bridge-store": "bridge-store/admin.sock",
    "controller": "controller.sock",
}
START_S = 60.0


def _needs(module: str) -> Any:
    """Import `module` (the deploy extra's); missing: skip outside CI, fail under CI=true."""
    try:
        return __import__(module)
    except ImportError:
        reason = f"python module {module} is missing: pip install '.[deploy]'"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def _compose() -> dict[str, Any]:
    yaml = _needs("yaml")
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


# -- the file ----------------------------------------------------------------------------------


def _structure_problems(data: dict[str, Any]) -> list[str]:
    """What Compose would refuse or what would break the box: unknown keys, a service with no
    image, a volume or dependency that is not declared, a run dir not shared by every service,
    a Dockerfile or build context that does not exist."""
    problems = [f"unknown top-level key {k}" for k in data if k not in TOP_LEVEL_KEYS and
                not k.startswith("x-")]  # fmt: skip
    services = data.get("services")
    if not isinstance(services, dict) or not services:
        return [*problems, "no services"]
    declared = set(data.get("volumes") or {})
    for name, service in services.items():
        problems += [f"{name}: unknown key {k}" for k in service if k not in SERVICE_KEYS]
        if "image" not in service and "build" not in service:
            problems.append(f"{name}: neither image nor build")
        build = service.get("build")
        if build is not None:
            context = CHECKOUT / build.get("context", ".")
            if not (context / build.get("dockerfile", "Dockerfile")).is_file():
                problems.append(f"{name}: no Dockerfile {build.get('dockerfile')} in {context}")
        if not isinstance(service.get("command"), list):
            problems.append(f"{name}: command must be an argv list (no shell)")
        mounts = [str(v).split(":") for v in service.get("volumes", [])]
        problems += [f"{name}: volume {m[0]} not declared" for m in mounts if m[0] not in declared]
        if not any(m[1:2] == [RUN_DIR] for m in mounts):
            problems.append(f"{name}: does not mount the shared run dir at {RUN_DIR}")
        for dependency in service.get("depends_on", {}):
            if dependency not in services:
                problems.append(f"{name}: depends on unknown service {dependency}")
    return problems


def test_compose_file_is_valid() -> None:
    data = _compose()
    assert _structure_problems(data) == []
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 check=False).returncode == 0:  # fmt: skip
        result = subprocess.run(
            [docker, "compose", "-f", str(COMPOSE_FILE), "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr


def test_the_structure_check_finds_a_broken_file() -> None:
    data = _compose()
    broken = {
        **data,
        "servics": {},
        "services": {
            "proxy": {**data["services"]["proxy"], "volumes": ["nowhere:/run/lnk"]},
            "controller": {**data["services"]["controller"], "command": "python -m x"},
        },
    }
    problems = _structure_problems(broken)
    assert "unknown top-level key servics" in problems
    assert "proxy: volume nowhere not declared" in problems
    assert "controller: command must be an argv list (no shell)" in problems


def test_only_the_controller_is_root_and_privileged() -> None:
    services = _compose()["services"]
    assert sorted(services) == ["bridge-store", "controller", "proxy"]
    for name, user in (("proxy", "lnk-proxy"), ("bridge-store", "lnk-bridge-store")):
        assert services[name]["user"] == user
        assert "no-new-privileges:true" in services[name]["security_opt"]
        assert services[name]["cap_drop"] == ["ALL"]
        assert services[name]["read_only"] is True
    privileged = sorted(n for n, s in services.items() if s.get("privileged"))
    assert privileged == ["controller"]


# -- the containers ----------------------------------------------------------------------------


def _engine_socket_answers() -> bool:
    """Whether something listens on the engine's unix socket. Asked before the SDK, which
    leaks its socket when the engine is absent (a ResourceWarning, an error under pytest)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a TCP engine: the SDK finds out
    with socket.socket(socket.AF_UNIX) as sock:
        return sock.connect_ex(host.removeprefix("unix://")) == 0


def _engine() -> Any:
    """A Docker client whose engine answers, or None."""
    docker = _needs("docker")
    if not _engine_socket_answers():
        return None
    try:
        client = docker.from_env(timeout=10)
    except docker.errors.DockerException:
        return None
    try:
        client.ping()
    except docker.errors.DockerException:
        client.close()  # its connection pool holds a socket to the absent engine
        return None
    return client


@contextmanager
def box_containers(engine: Any) -> Iterator[dict[str, Any]]:
    """The services of compose.test.yml started with the SDK as the file says; all removed."""
    services = _compose()["services"]
    tag = os.urandom(3).hex()
    image_name = services["proxy"]["image"].split(":")[0] + f":{tag}"
    image, _ = engine.images.build(
        path=str(CHECKOUT),
        dockerfile=services["proxy"]["build"]["dockerfile"],
        tag=image_name,
        rm=True,
    )
    volumes = {
        name: engine.volumes.create(f"lnk-box-test-{tag}-{name}") for name in ("run", "state")
    }
    started: dict[str, Any] = {}
    try:
        for name in ("proxy", "bridge-store", "controller"):
            service = services[name]
            binds = {}
            for spec in service["volumes"]:
                volume, target = spec.split(":")[:2]
                binds[volumes[volume].name] = {"bind": target, "mode": "rw"}
            started[name] = engine.containers.run(
                image.id,
                command=service["command"],
                user=service.get("user", "root"),
                environment=service.get("environment"),
                volumes=binds,
                privileged=bool(service.get("privileged")),
                read_only=bool(service.get("read_only")),
                tmpfs=dict.fromkeys(service.get("tmpfs", []), ""),
                cap_drop=service.get("cap_drop"),
                security_opt=service.get("security_opt"),
                name=f"lnk-box-test-{tag}-{name}",
                detach=True,
            )
            _wait_for_socket(started[name], f"{RUN_DIR}/{READY_SOCKETS[name]}")
        yield started
    finally:
        for container in reversed(list(started.values())):
            container.remove(force=True)
        for volume in volumes.values():
            volume.remove(force=True)
        engine.images.remove(image.id, force=True)


def _wait_for_socket(container: Any, path: str) -> None:
    probe = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"
    deadline = time.monotonic() + START_S
    while container.exec_run(["/opt/lnk/venv/bin/python", "-c", probe]).exit_code != 0:
        container.reload()
        if container.status != "running" or time.monotonic() > deadline:
            raise AssertionError(f"{container.name}: {container.logs().decode()[-2000:]}")
        time.sleep(0.5)


def test_the_controller_in_its_container_answers_through_the_shared_run_dir() -> None:
    engine = _engine()
    if engine is None:
        # CI has no engine, and there a skip fails the run: the absence is what is asserted
        # (a CI machine that gains an engine runs the containers instead).
        if os.environ.get("CI") == "true":
            docker = shutil.which("docker")
            if docker:
                info = subprocess.run([docker, "info"], capture_output=True, check=False)
                assert info.returncode != 0
            return
        pytest.skip("no Docker engine is reachable here (docker info fails): compose not run")
    with box_containers(engine) as started:
        # From the proxy's container (another one) through the shared volume: the API answers.
        call = (
            "from lnk_shared.api_client import api_request; "
            f"print(api_request('{RUN_DIR}/controller.sock', 'GET', '/v1/sandboxes',"
            " timeout=10)[0])"
        )
        result = started["proxy"].exec_run(["/opt/lnk/venv/bin/python", "-c", call])
        assert result.exit_code == 0, result.output.decode()
        assert result.output.decode().strip() == "200"
