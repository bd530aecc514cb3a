#!/usr/bin/python3
"""Checks deploy/ with real tools where Debian has them, and a schema and
consistency check where it does not (deploy/README.md, "Checked in CI"):

- shellcheck: the Slurm scripts and the .deb maintainer scripts;
- systemd-analyze: `verify` of the unit (with ExecStart naming the built
  server; any complaint fails) and `security --offline=true`, whose exposure
  score must stay at or below MAX_SYSTEMD_EXPOSURE;
- Kubernetes (no cluster, and kubeconform is not in Debian): every object's
  keys against a schema of the fields the manifest may use (a misspelt field,
  which the API server would drop, fails), the StatefulSet's serviceName a
  headless Service, selectors matching the pod labels, probes and the
  Service naming ports the container has, mounts naming a volume claim;
- every depot-server flag in the unit, the Slurm scripts, the Dockerfile and
  the manifest is a flag the built server takes (`depot-server --help`).

Usage: check_deploy.py DEPOT_SERVER_BINARY
"""

import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# deploy/README.md quotes this figure; lower it when the unit gets tighter.
MAX_SYSTEMD_EXPOSURE = 1.5

failures = []
quiet = False  # the self-test's expected failures are not printed


def fail(what):
    failures.append(what)
    if not quiet:
        print(f"FAIL: {what}")


def need(tool):
    path = shutil.which(tool)
    if path is None:
        fail(f"{tool} is not installed (scripts/setup.sh installs it)")
    return path


def server_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    flags = set(re.findall(r"^\s+--([a-z_]+)", out.stdout + out.stderr,
                           re.MULTILINE))
    if "listen" not in flags:
        fail(f"`{binary} --help` lists no --listen flag: cannot read flags")
    return flags


# Where each file runs depot-server: the text of that command line.
INVOCATIONS = {
    "systemd": r"^ExecStart=((?:.*\\\n)*.*)$",
    "slurm": r"exec \"\$2\"(.*?)'",
    "docker": r"^CMD \[(.*)\]$",
}


def invocation(where, text, kind):
    found = re.findall(INVOCATIONS[kind], text,
                       re.MULTILINE | (re.DOTALL if kind == "slurm" else 0))
    if not found:
        fail(f"{where}: no depot-server command line found")
    return "\n".join(found)


def check_flags(where, text, flags):
    used = set(re.findall(r"(?<![\w-])--([a-z][a-z_]+)=", text))
    for flag in sorted(used):
        if flag not in flags:
            fail(f"{where}: --{flag} is not a depot-server flag")
    return used


# -- shellcheck -------------------------------------------------------------

def check_shell():
    if not need("shellcheck"):
        return
    scripts = sorted(DEPLOY.glob("slurm/*.sbatch")) + \
        sorted((DEPLOY / "debian").iterdir())
    out = subprocess.run(["shellcheck", "--shell=bash", *map(str, scripts)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"shellcheck:\n{out.stdout}{out.stderr}")
    else:
        print(f"ok: shellcheck, {len(scripts)} scripts")


# -- systemd ----------------------------------------------------------------

def check_systemd(binary, flags):
    unit = DEPLOY / "systemd" / "depot-server.service"
    text = unit.read_text()
    check_flags(unit.name, invocation(unit.name, text, "systemd"), flags)
    if not need("systemd-analyze"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / unit.name
        copy.write_text(text.replace("/usr/local/bin/depot-server",
                                     str(pathlib.Path(binary).resolve())))
        out = subprocess.run(["systemd-analyze", "verify", str(copy)],
                             capture_output=True, text=True)
        if out.returncode != 0 or out.stdout.strip() or out.stderr.strip():
            fail(f"systemd-analyze verify:\n{out.stdout}{out.stderr}")
        else:
            print("ok: systemd-analyze verify")
    out = subprocess.run(["systemd-analyze", "security", "--offline=true",
                          "--no-pager", str(unit)],
                         capture_output=True, text=True)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)",
                      out.stdout + out.stderr)
    if match is None:
        fail(f"systemd-analyze security gave no score:\n{out.stdout}"
             f"{out.stderr}")
        return
    score = float(match.group(1))
    if score > MAX_SYSTEMD_EXPOSURE:
        fail(f"systemd-analyze security: exposure {score} > "
             f"{MAX_SYSTEMD_EXPOSURE}")
    else:
        print(f"ok: systemd-analyze security: exposure {score} "
              f"(at most {MAX_SYSTEMD_EXPOSURE})")


# -- Kubernetes -------------------------------------------------------------

# The fields the manifest may use, per structure (a subset of the API's: a
# field the manifest needs and this lacks is added here deliberately).
ANY = object()
SCHEMA = {
    "object": {"apiVersion": str, "kind": str, "metadata": "metadata",
               "spec": ANY},
    "metadata": {"name": str, "namespace": str, "labels": dict,
                 "annotations": dict},
    "Service": {"clusterIP": str, "publishNotReadyAddresses": bool,
                "selector": dict, "ports": ["servicePort"]},
    "servicePort": {"name": str, "port": int, "targetPort": ANY,
                    "protocol": str},
    "StatefulSet": {"serviceName": str, "replicas": int,
                    "podManagementPolicy": str, "updateStrategy": dict,
                    "selector": "selector", "template": "podTemplate",
                    "volumeClaimTemplates": ["claimTemplate"]},
    "selector": {"matchLabels": dict},
    "podTemplate": {"metadata": "metadata", "spec": "podSpec"},
    "podSpec": {"affinity": dict, "terminationGracePeriodSeconds": int,
                "securityContext": "podSecurity", "containers": ["container"],
                "volumes": list, "nodeSelector": dict},
    "podSecurity": {"runAsNonRoot": bool, "runAsUser": int,
                    "runAsGroup": int, "fsGroup": int,
                    "seccompProfile": dict},
    "container": {"name": str, "image": str, "args": [str], "env": list,
                  "ports": ["containerPort"], "startupProbe": "probe",
                  "readinessProbe": "probe", "livenessProbe": "probe",
                  "resources": dict, "volumeMounts": ["volumeMount"],
                  "securityContext": "containerSecurity"},
    "containerPort": {"name": str, "containerPort": int, "protocol": str},
    "probe": {"grpc": "grpcAction", "periodSeconds": int,
              "initialDelaySeconds": int, "failureThreshold": int,
              "timeoutSeconds": int},
    "grpcAction": {"port": int, "service": str},
    "volumeMount": {"name": str, "mountPath": str, "readOnly": bool},
    "containerSecurity": {"allowPrivilegeEscalation": bool,
                          "readOnlyRootFilesystem": bool,
                          "capabilities": dict},
    "claimTemplate": {"metadata": "metadata", "spec": "claimSpec"},
    "claimSpec": {"accessModes": [str], "resources": dict,
                  "storageClassName": str},
    "PodMonitor": {"selector": "selector",
                   "podMetricsEndpoints": ["podMetricsEndpoint"]},
    "podMetricsEndpoint": {"port": str, "path": str, "interval": str,
                           "relabelings": list},
    "PodDisruptionBudget": {"maxUnavailable": int, "selector": "selector"},
}
API_VERSIONS = {"Namespace": "v1", "Service": "v1",
                "StatefulSet": "apps/v1",
                "PodMonitor": "monitoring.coreos.com/v1",
                "PodDisruptionBudget": "policy/v1"}


def check_schema(where, value, schema):
    if schema is ANY:
        return
    if isinstance(schema, list):
        if not isinstance(value, list):
            fail(f"{where}: a list expected, not {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check_schema(f"{where}[{i}]", item, schema[0])
        return
    if isinstance(schema, str):
        schema = SCHEMA[schema]
    if isinstance(schema, type):
        if not isinstance(value, schema) or \
                (schema is int and isinstance(value, bool)):
            fail(f"{where}: {schema.__name__} expected, not {value!r}")
        return
    if not isinstance(value, dict):
        fail(f"{where}: a mapping expected, not {value!r}")
        return
    for key, item in value.items():
        if key not in schema:
            fail(f"{where}: unknown field {key!r}")
        else:
            check_schema(f"{where}.{key}", item, schema[key])


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_kubernetes(flags, text=None):
    path = DEPLOY / "kubernetes" / "depot-server.yaml"
    text = path.read_text() if text is None else text
    docs = [d for d in yaml.safe_load_all(text) if d]
    by_kind = {}
    for doc in docs:
        kind = doc.get("kind")
        where = f"{path.name} {kind}/{doc.get('metadata', {}).get('name')}"
        if API_VERSIONS.get(kind) != doc.get("apiVersion"):
            fail(f"{where}: apiVersion {doc.get('apiVersion')!r}, expected "
                 f"{API_VERSIONS.get(kind)!r}")
        check_schema(where, {k: v for k, v in doc.items() if k != "spec"},
                     "object")
        if "spec" in doc:
            check_schema(f"{where}.spec", doc["spec"], kind)
        by_kind.setdefault(kind, []).append(doc)
    sets = by_kind.get("StatefulSet", [])
    if len(sets) != 1:
        fail(f"{path.name}: one StatefulSet expected, found {len(sets)}")
        return
    sts = sets[0]
    spec = sts["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    if not matches(spec["selector"]["matchLabels"], labels):
        fail("StatefulSet: its selector does not match its pod labels")
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    service = services.get(spec["serviceName"])
    if service is None or service["spec"].get("clusterIP") != "None":
        fail(f"StatefulSet: serviceName {spec['serviceName']!r} is not a "
             f"headless Service of the manifest")
    elif not matches(service["spec"]["selector"], labels):
        fail("Service: its selector does not match the pod labels")
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = container.get(probe, {}).get("grpc", {}).get("port")
        if port not in ports.values():
            fail(f"{probe}: port {port} is not a container port")
    if service is not None:
        for p in service["spec"]["ports"]:
            if p["targetPort"] not in ports:
                fail(f"Service port {p['name']}: targetPort "
                     f"{p['targetPort']!r} is not a container port name")
    claims = {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in claims:
            fail(f"volumeMount {mount['name']!r} names no volume claim")
    args = "\n".join(container["args"])
    used = check_flags("kubernetes args", args, flags)
    for flag in ("checkpoint_dir", "listen", "metrics_listen"):
        if flag not in used:
            fail(f"kubernetes args: --{flag} missing")
    mount_paths = [m["mountPath"] for m in container.get("volumeMounts", [])]
    checkpoint_dir = re.search(r"--checkpoint_dir=(\S+)", args)
    if checkpoint_dir and not any(
            checkpoint_dir.group(1).startswith(p) for p in mount_paths):
        fail("kubernetes: --checkpoint_dir is not on the mounted volume "
             "(the root filesystem is read-only)")
    for monitor in by_kind.get("PodMonitor", []):
        if not matches(monitor["spec"]["selector"]["matchLabels"], labels):
            fail("PodMonitor: its selector does not match the pod labels")
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            if endpoint["port"] not in ports:
                fail(f"PodMonitor: port {endpoint['port']!r} is not a "
                     f"container port name")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not matches(pdb["spec"]["selector"]["matchLabels"], labels):
            fail("PodDisruptionBudget: its selector does not match")
    if not quiet:
        print(f"ok: kubernetes, {len(docs)} objects checked")


def check_other_flags(flags):
    for path, kind in [(p, "slurm") for p in
                       sorted(DEPLOY.glob("slurm/*.sbatch"))] + \
            [(DEPLOY / "docker" / "Dockerfile", "docker")]:
        where = str(path.relative_to(REPO))
        used = check_flags(where, invocation(where, path.read_text(), kind),
                           flags)
        print(f"ok: {where}: {len(used)} depot-server flags"
              if used else f"{where}: no flags found")


# Mistakes the Kubernetes check must catch, each made in a copy of the
# manifest: (what is replaced, by what).
MUTATIONS = [
    ("readinessProbe:", "readinesProbe:"),            # a misspelt field
    ("--checkpoint_every_steps=", "--checkpoint_every="),  # no such flag
    ("serviceName: depot-server", "serviceName: depot"),   # no such Service
    ("mountPath: /var/lib/depot", "mountPath: /data"),     # dir not mounted
    ("grpc:\n              port: 50051",                # a probe's port
     "grpc:\n              port: 50052"),
    ("    - port: metrics", "    - port: metric"),        # PodMonitor port
]


def self_test(flags):
    """The Kubernetes check fails on each mutation of the manifest."""
    global quiet
    missed = len(failures)
    text = (DEPLOY / "kubernetes" / "depot-server.yaml").read_text()
    for old, new in MUTATIONS:
        if old not in text:
            fail(f"self-test: {old!r} is not in the manifest any more")
            continue
        before = len(failures)
        quiet = True
        check_kubernetes(flags, text.replace(old, new, 1))
        quiet = False
        caught = len(failures) > before
        del failures[before:]
        if not caught:
            fail(f"self-test: the check missed {old!r} -> {new!r}")
    if len(failures) == missed:
        print(f"ok: self-test, {len(MUTATIONS)} mutations of the manifest "
              f"caught")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    flags = server_flags(binary)
    self_test(flags)
    check_shell()
    check_systemd(binary, flags)
    check_kubernetes(flags)
    check_other_flags(flags)
    if failures:
        sys.exit(f"check_deploy: {len(failures)} failure(s)")
    print("check_deploy: all deploy files pass")


if __name__ == "__main__":
    main()
