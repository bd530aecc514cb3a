"""TLS, tokens and tenants through the Python package (docs/security.md),
against real depot-server processes; openssl makes the certificates here."""
import subprocess

import numpy as np
import pytest

import depot
import server_process
from conftest import server_binary

ALPHA_TOKEN = "alpha-py-token-5c1e"
BETA_TOKEN = "beta-py-token-93ab"


def _openssl(directory, *args):
    subprocess.run(["openssl", *args], cwd=directory, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    _openssl(d, "req", "-x509", *ec, "-days", "1", "-subj", "/CN=py-ca",
             "-keyout", "ca.key", "-out", "ca.pem")
    _openssl(d, "req", *ec, "-subj", "/CN=localhost", "-keyout",
             "server.key", "-out", "server.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(d, "x509", "-req", "-days", "1", "-in", "server.csr", "-CA",
             "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-extfile",
             "san.ext", "-out", "server.pem")
    _openssl(d, "req", *ec, "-subj", "/CN=gamma", "-keyout", "gamma.key",
             "-out", "gamma.csr")
    _openssl(d, "x509", "-req", "-days", "1", "-in", "gamma.csr", "-CA",
             "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "gamma.pem")
    lines = []
    for tenant, token in (("alpha", ALPHA_TOKEN), ("beta", BETA_TOKEN)):
        digest = subprocess.run(["openssl", "dgst", "-sha256", "-r"],
                                input=token.encode(), check=True,
                                capture_output=True).stdout.decode()
        lines.append(f"{tenant} {digest.split()[0]}")
    (d / "tokens").write_text("\n".join(lines) + "\n")
    (d / "beta.token").write_text(BETA_TOKEN + "\n")
    return d


@pytest.fixture(scope="module")
def secured_server(pki):
    server = server_process.start_server(
        server_binary(),
        [f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}",
         f"--auth_token_file={pki / 'tokens'}", "--threads=2"],
        client_options={"tls_ca": str(pki / "ca.pem")})
    yield server
    server.stop()


TENSORS = [("w", 300, 0), ("b", 20, 0)]


def test_a_tenant_trains_and_another_cannot_see_its_job(pki, secured_server):
    ca = str(pki / "ca.pem")
    with depot.Client([secured_server.address], tls_ca=ca,
                      token=ALPHA_TOKEN) as alpha:
        job = alpha.open_job("py-secure", TENSORS, optimizer="sgd")
        n = job.total_elems
        weights = np.linspace(-1, 1, n, dtype=np.float32)
        job.init_weights(weights)
        out = np.empty(n, dtype=np.float32)
        job.step(1, np.full(n, 0.5, dtype=np.float32), out)
        assert not np.array_equal(out, weights)
        with depot.Client([secured_server.address], tls_ca=ca,
                          token_file=str(pki / "beta.token")) as beta:
            # Job names are per tenant: beta's "py-secure" is its own job,
            # and alpha's goes on untouched.
            other = beta.open_job("py-secure", TENSORS, optimizer="sgd")
            assert other.status()[0].job_id != job.status()[0].job_id
            other.init_weights(np.zeros(n, dtype=np.float32))
            theirs = np.empty(n, dtype=np.float32)
            other.step(1, np.full(n, 0.5, dtype=np.float32), theirs)
            assert not np.array_equal(theirs, out)
            other.delete()
            again = np.empty(n, dtype=np.float32)
            job.step(2, np.full(n, 0.5, dtype=np.float32), again)
            assert not np.array_equal(again, out)
        job.delete()
    log = secured_server.log()
    assert 'audit: DeleteJob tenant="alpha"' in log
    assert 'audit: CreateJob tenant="beta"' in log


def test_without_a_token_calls_are_unauthenticated(pki, secured_server):
    with depot.Client([secured_server.address],
                      tls_ca=str(pki / "ca.pem")) as anonymous:
        anonymous.wait_for_servers(30)  # the health service stays open
        with pytest.raises(depot.UnauthenticatedError):
            anonymous.open_job("py-anonymous", TENSORS, optimizer="sgd")


def test_a_client_certificate_names_the_tenant(pki):
    ca = str(pki / "ca.pem")
    server = server_process.start_server(
        server_binary(),
        [f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}",
         f"--tls_client_ca={ca}", "--threads=2"],
        client_options={"tls_ca": ca})
    try:
        with depot.Client([server.address], tls_ca=ca,
                          tls_cert=str(pki / "gamma.pem"),
                          tls_key=str(pki / "gamma.key")) as gamma:
            gamma.open_job("py-mtls", TENSORS, optimizer="sgd").delete()
        with depot.Client([server.address], tls_ca=ca) as anonymous:
            with pytest.raises(depot.UnauthenticatedError):
                anonymous.open_job("py-mtls-anon", TENSORS, optimizer="sgd")
        assert 'audit: CreateJob tenant="gamma"' in server.log()
    finally:
        server.stop()


def test_a_token_without_tls_is_refused_before_connecting():
    with pytest.raises(depot.InvalidArgumentError, match="tls_ca_file"):
        depot.Client(["127.0.0.1:50051"], token=ALPHA_TOKEN)


def test_depot_optimizer_connects_with_credentials(pki, secured_server):
    torch = pytest.importorskip("torch")
    from depot.torch import DepotOptimizer
    model = torch.nn.Linear(4, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = DepotOptimizer(model.parameters(), [secured_server.address],
                         job_name="py-secure-optimizer", optimizer="sgd",
                         lr=0.1, tls_ca=str(pki / "ca.pem"),
                         token_file=str(pki / "beta.token"))
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    assert any(not torch.equal(b, p.detach())
               for b, p in zip(before, model.parameters()))
    assert 'audit: CreateJob tenant="beta"' in secured_server.log()


def test_depot_optimizer_refuses_credentials_beside_a_client(pki, client):
    torch = pytest.importorskip("torch")
    from depot.torch import DepotOptimizer
    with pytest.raises(ValueError, match="credentials"):
        DepotOptimizer(torch.nn.Linear(2, 2).parameters(), client=client,
                       job_name="py-refused", token="x")
