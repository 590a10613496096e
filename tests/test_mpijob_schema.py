"""`toolkit config mpijob` manifests against the Kubeflow MPI operator's own MPIJob v2beta1.

The oracle is the operator's CRD, kept verbatim in tests/schemas/ (source and commit in
tests/schemas/README.md): its openAPIV3Schema, with fields it does not know rejected as
`kubectl apply --validate=strict` (kubectl's default) rejects them, plus the checks the operator
makes after filling in its defaults (pkg/apis/kubeflow/validation/validation.go and
v2beta1/default.go at the same commit, ported below), which the schema cannot express.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit import engines
from toolkit.cli import main
from toolkit.render.mpijob import mpijob_manifest
from toolkit.spec import SpecError, TrainSpec
from toolkit.spec.sections import DNS_LABEL

jsonschema = pytest.importorskip("jsonschema")

CRD = Path(__file__).with_name("schemas") / "kubeflow.org_mpijobs.yaml"
UPSTREAM_BLOB = "e7c24a6a51d0d741243c5c0dd002cac8fb26ea29"
COMMAND = ["train.py", "--note", "a; rm -rf / $(id) 'q'"]
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def strict(schema: Any) -> Any:
    """Every object schema that lists its properties refuses others, unless it says it keeps
    unknown fields (x-kubernetes-preserve-unknown-fields) or types its extra values."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    keeps_unknown = out.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in out and "additionalProperties" not in out and not keeps_unknown:
        out["additionalProperties"] = False
    return out


@functools.cache
def validator() -> Any:
    crd = yaml.load(CRD.read_text(), Loader=Loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    # OpenAPI 3.0 schemas are JSON Schema draft 4 with extensions (x-kubernetes-*), which
    # draft 4 validators ignore.
    return jsonschema.Draft4Validator(schema)


def schema_errors(manifest: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in validator().iter_errors(manifest)
    ]


def operator_errors(manifest: dict[str, Any]) -> list[str]:
    """ValidateMPIJob (validation.go) of the manifest after SetDefaults_MPIJob (default.go)."""
    job = copy.deepcopy(manifest)
    spec = job["spec"]
    run_policy = spec.setdefault("runPolicy", {})
    run_policy.setdefault("cleanPodPolicy", "None")
    spec.setdefault("slotsPerWorker", 1)
    spec.setdefault("sshAuthMountPath", "/root/.ssh")
    spec.setdefault("mpiImplementation", "OpenMPI")
    replicas = spec.get("mpiReplicaSpecs")
    errors = []
    if not replicas:
        return ["spec.mpiReplicaSpecs: must have replica specs"]
    launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
    if launcher is not None:
        launcher.setdefault("restartPolicy", "OnFailure")
        launcher.setdefault("replicas", 1)
    if worker is not None:
        worker.setdefault("restartPolicy", "Never")
        worker.setdefault("replicas", 0)

    workers = worker["replicas"] if worker is not None and worker["replicas"] > 0 else 1
    pod = f"{job['metadata']['name']}-worker-{workers - 1}"
    if not (DNS_1035_LABEL.fullmatch(pod) and len(pod) <= 63):
        errors.append(f"metadata.name: pod name {pod!r} is not a DNS-1035 label")
    if spec["slotsPerWorker"] < 0:
        errors.append("spec.slotsPerWorker: must be non-negative")
    if run_policy["cleanPodPolicy"] not in {"None", "Running", "All"}:
        errors.append("spec.runPolicy.cleanPodPolicy: not supported")
    for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if run_policy.get(field, 0) < 0:
            errors.append(f"spec.runPolicy.{field}: must be non-negative")
    managed_by = run_policy.get("managedBy")
    if managed_by is not None and managed_by not in {
        "kueue.x-k8s.io/multikueue",
        "kubeflow.org/mpi-operator",
    }:
        errors.append("spec.runPolicy.managedBy: not supported")
    if not spec["sshAuthMountPath"]:
        errors.append("spec.sshAuthMountPath: required")
    if spec["mpiImplementation"] not in {"OpenMPI", "Intel", "MPICH"}:
        errors.append("spec.mpiImplementation: not supported")
    if launcher is None:
        errors.append("spec.mpiReplicaSpecs[Launcher]: required")
    for name, replica in (("Launcher", launcher), ("Worker", worker)):
        if replica is None:
            continue
        if replica["restartPolicy"] not in {"Never", "OnFailure"}:
            errors.append(f"spec.mpiReplicaSpecs[{name}].restartPolicy: not supported")
        if not replica.get("template", {}).get("spec", {}).get("containers"):
            errors.append(f"spec.mpiReplicaSpecs[{name}].template.spec.containers: required")
    if launcher is not None and launcher["replicas"] != 1:
        errors.append("spec.mpiReplicaSpecs[Launcher].replicas: must be 1")
    if worker is not None and worker["replicas"] <= 0:
        errors.append("spec.mpiReplicaSpecs[Worker].replicas: must be at least 1")
    return errors


def horovod_spec(launch: dict[str, Any]) -> dict[str, Any]:
    """Horovod under mpirun, the usual MPIJob, as a spec."""
    launch = {**launch, "launcher": engines.MPIJOB_LAUNCHERS[0]}
    return {"backend": "horovod", "horovod": {"controller": "mpi"}, "launch": launch}


def assert_valid(manifest: dict[str, Any]) -> None:
    errors = schema_errors(manifest) + operator_errors(manifest)
    assert not errors, "\n".join(errors)


def test_the_crd_is_the_upstream_file_unchanged() -> None:
    assert git_blob_id(CRD.read_bytes()) == UPSTREAM_BLOB


@pytest.mark.parametrize(
    "manifest",
    [
        {"spec": {"slotsPerWorker": 1}},
        {"spec": {"mpiReplicaSpecs": {}, "slotsPerWorker": "4"}},
        {"spec": {"mpiReplicaSpecs": {}, "runPolicy": {"cleanPodPolicy": "Running"}, "sltos": 1}},
    ],
    ids=["no replica specs", "slots as a string", "misspelled field"],
)
def test_the_schema_rejects_what_the_api_server_would(manifest: dict[str, Any]) -> None:
    """The oracle is not vacuous: a missing required field, a wrong type and an unknown field
    fail."""
    assert schema_errors(manifest)


def test_the_operator_checks_reject_what_the_operator_would() -> None:
    manifest = mpijob_manifest(TrainSpec.from_dict(horovod_spec({})), COMMAND)
    assert operator_errors(manifest) == []
    manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"] = []
    assert len(operator_errors(manifest)) == 2


MPIJOB_ENGINES = [
    entry
    for entry in engines.ENGINES
    if any(launcher in entry.launchers for launcher in engines.MPIJOB_LAUNCHERS)
]


@pytest.mark.parametrize("entry", MPIJOB_ENGINES, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "launch",
    [
        {"np": 2},
        {"hosts": ["node-a:4", "node-b:4"], "image": "registry.example/toolkit:1.2"},
        {
            "hosts": ["10.0.0.1:2", "10.0.0.2:2", "10.0.0.3:2"],
            "job_name": "mnist-hvd",
            "threads_per_rank": 4,
            "python": "/opt/toolkit/.venv/bin/python",
            "env": {"NCCL_DEBUG": "INFO", "ODD": "a b; $(id) 'q' \"d\""},
        },
    ],
    ids=["np", "hosts", "everything"],
)
def test_rendered_manifests_are_valid_mpijobs(
    entry: engines.Engine, launch: dict[str, Any]
) -> None:
    data = horovod_spec(launch) | {"backend": entry.backend, "framework": entry.framework}
    manifest = mpijob_manifest(TrainSpec.from_dict(data), COMMAND)
    assert_valid(manifest)
    workers = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert workers == max(1, len(launch.get("hosts", [])))


def test_the_cli_output_is_a_valid_mpijob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "train.yaml"
    spec.write_text(yaml.safe_dump(horovod_spec({"hosts": ["a:2", "b:2"]})))
    assert main(["config", "mpijob", "--spec", str(spec), "--", *COMMAND]) == 0
    assert_valid(yaml.safe_load(capsys.readouterr().out))


@settings(max_examples=60, deadline=None)
@given(name=st.from_regex(DNS_LABEL, fullmatch=True), hosts=st.integers(1, 12))
def test_a_job_name_is_accepted_exactly_when_the_operator_accepts_it(name: str, hosts: int) -> None:
    """The operator names pods <name>-worker-<i> and rejects the job unless the last one is
    a DNS-1035 label (a letter first, at most 63 characters): the spec's DNS-1123 rule alone
    lets through names the operator refuses."""
    data = horovod_spec({"job_name": name, "hosts": [f"h{i}:1" for i in range(hosts)]})
    last_pod = f"{name}-worker-{hosts - 1}"
    operator_accepts = bool(DNS_1035_LABEL.fullmatch(last_pod)) and len(last_pod) <= 63
    try:
        manifest = mpijob_manifest(TrainSpec.from_dict(data), COMMAND)
    except SpecError as error:
        assert not operator_accepts, error.one_line()
        assert "launch.job_name" in error.one_line()
        return
    assert operator_accepts, f"rendered a job the operator rejects: {last_pod!r}"
    assert_valid(manifest)
