// TLS, mTLS, tokens and tenants (docs/security.md), against real depot-server
// processes on loopback. Every certificate is made by the openssl command-line
// tool in a temp dir when the suite starts; no key is checked in.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "depot/client.h"
#include "depot/v1/depot.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "training_data.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAlphaToken[] = "alpha-token-7f3a91c2";
constexpr char kBetaToken[] = "beta-token-0d44e8b6";

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Runs `command` with sh; its output goes to `dir`/openssl.log.
void Run(const std::string& dir, const std::string& command) {
  const std::string line =
      absl::StrCat("cd '", dir, "' && (", command, ") >>openssl.log 2>&1");
  ASSERT_EQ(std::system(line.c_str()), 0) << command << "\n"
                                          << ReadText(dir + "/openssl.log");
}

// A CA and the certificates it signs, made by openssl in a temp dir.
class TestPki {
 public:
  void Make() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "depot-pki.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    ASSERT_NO_FATAL_FAILURE(MakeCa("ca"));
    ASSERT_NO_FATAL_FAILURE(MakeCa("rogue-ca"));
    // The server's: for the loopback address the tests connect to.
    ASSERT_NO_FATAL_FAILURE(
        MakeLeaf("ca", "server", "localhost",
                 "subjectAltName=IP:127.0.0.1,DNS:localhost"));
    ASSERT_NO_FATAL_FAILURE(MakeLeaf("ca", "alpha", "alpha", ""));
    ASSERT_NO_FATAL_FAILURE(MakeLeaf("ca", "beta", "beta", ""));
    // Says it is alpha, signed by a CA the server does not trust.
    ASSERT_NO_FATAL_FAILURE(MakeLeaf("rogue-ca", "rogue", "alpha", ""));
    // Tokens stored hashed, the hash made by openssl (not by the server).
    std::string tokens = "# tenant  sha256(token)\n";
    for (const auto& [tenant, token] :
         {std::pair{"alpha", kAlphaToken}, std::pair{"beta", kBetaToken}}) {
      ASSERT_NO_FATAL_FAILURE(
          Run(dir_, absl::StrCat("printf %s '", token,
                                 "' | openssl dgst -sha256 -r > hash.txt")));
      const std::string hash = ReadText(path("hash.txt")).substr(0, 64);
      absl::StrAppend(&tokens, tenant, " ", hash, "\n");
    }
    WriteText(path("tokens"), tokens);
    WriteText(path("alpha.token"), absl::StrCat(kAlphaToken, "\n"));
  }

  void Remove() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string path(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }

 private:
  void MakeCa(const std::string& name) {
    Run(dir_,
        absl::StrCat("openssl req -x509 -newkey ec -pkeyopt "
                     "ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=",
                     name, "' -keyout ", name, ".key -out ", name, ".pem"));
  }

  void MakeLeaf(const std::string& ca, const std::string& name,
                const std::string& common_name, const std::string& extension) {
    Run(dir_, absl::StrCat("openssl req -newkey ec -pkeyopt "
                           "ec_paramgen_curve:prime256v1 -nodes -subj '/CN=",
                           common_name, "' -keyout ", name, ".key -out ", name,
                           ".csr"));
    std::string sign = absl::StrCat("openssl x509 -req -days 2 -in ", name,
                                    ".csr -CA ", ca, ".pem -CAkey ", ca,
                                    ".key -CAcreateserial -out ", name, ".pem");
    if (!extension.empty()) {
      WriteText(path(name + ".ext"), extension + "\n");
      absl::StrAppend(&sign, " -extfile ", name, ".ext");
    }
    Run(dir_, sign);
  }

  std::string dir_;
};

TestPki* pki = nullptr;
bool pki_ready = false;

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki = new TestPki();
    pki->Make();
    pki_ready = !::testing::Test::HasFatalFailure();
  }
  static void TearDownTestSuite() {
    pki->Remove();
    delete pki;
    pki = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(pki_ready) << "the test PKI could not be made (see above)";
  }

  std::vector<std::string> TlsFlags() const {
    return {"--tls_cert=" + pki->path("server.pem"),
            "--tls_key=" + pki->path("server.key")};
  }

  // A server with TLS and the token file.
  std::unique_ptr<ServerProcess> StartTokenServer() {
    std::vector<std::string> flags = TlsFlags();
    flags.push_back("--auth_token_file=" + pki->path("tokens"));
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartTls(flags, pki->path("ca.pem"));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // The flags of a server with TLS, the token file and the checkpoint
  // directory `dir`, which this creates.
  std::vector<std::string> CheckpointingFlags(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    std::vector<std::string> flags = TlsFlags();
    flags.push_back("--auth_token_file=" + pki->path("tokens"));
    flags.push_back("--checkpoint_dir=" + dir);
    return flags;
  }

  // A server with TLS that names tenants by client certificate.
  std::unique_ptr<ServerProcess> StartMutualTlsServer() {
    std::vector<std::string> flags = TlsFlags();
    flags.push_back("--tls_client_ca=" + pki->path("ca.pem"));
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartTls(flags, pki->path("ca.pem"));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // A TLS channel trusting the test CA; `client` ("alpha", "beta", "rogue")
  // presents that certificate.
  static std::shared_ptr<grpc::Channel> TlsChannel(
      const ServerProcess& server, const std::string& client = "") {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadText(pki->path("ca.pem"));
    if (!client.empty()) {
      ssl.pem_cert_chain = ReadText(pki->path(client + ".pem"));
      ssl.pem_private_key = ReadText(pki->path(client + ".key"));
    }
    return grpc::CreateChannel(server.grpc_address(),
                               grpc::SslCredentials(ssl));
  }
};

// A call context with `token` as its bearer token (none when empty).
std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }
  return context;
}

v1::JobSpec Spec(const std::string& name) {
  v1::JobSpec spec;
  JobConfigToProto(SmallJobConfig(name, /*num_workers=*/1, /*num_servers=*/1),
                   &spec);
  return spec;
}

// The Checkpoint RPC of job `job_id` as `token`.
grpc::Status Checkpoint(v1::Depot::Stub& stub, const std::string& token,
                        uint64_t job_id, uint64_t fingerprint) {
  v1::CheckpointRequest request;
  request.set_job_id(job_id);
  request.set_fingerprint(fingerprint);
  v1::CheckpointResponse response;
  return stub.Checkpoint(Context(token).get(), request, &response);
}

grpc::Status CreateJob(v1::Depot::Stub& stub, const std::string& token,
                       const std::string& name, v1::CreateJobResponse* response,
                       double lr = 0) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = Spec(name);
  // Another config of the same name (another fingerprint).
  if (lr != 0) request.mutable_spec()->mutable_optimizer()->set_lr(lr);
  return stub.CreateJob(Context(token).get(), request, response);
}

// Every Depot RPC, each with a request for job `job_id` (fingerprint
// `fingerprint`) as `token`; returns the status of each, named.
std::vector<std::pair<std::string, grpc::Status>> CallEveryRpc(
    v1::Depot::Stub& stub, const std::string& token, uint64_t job_id,
    uint64_t fingerprint, const std::string& create_name) {
  std::vector<std::pair<std::string, grpc::Status>> results;
  {
    v1::CreateJobResponse response;
    results.emplace_back("CreateJob",
                         CreateJob(stub, token, create_name, &response));
  }
  {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::JobStatus response;
    results.emplace_back("GetJob",
                         stub.GetJob(Context(token).get(), request, &response));
  }
  results.emplace_back("Checkpoint",
                       Checkpoint(stub, token, job_id, fingerprint));
  {
    v1::ListCheckpointsRequest request;
    request.set_job_id(job_id);
    request.set_fingerprint(fingerprint);
    v1::ListCheckpointsResponse response;
    results.emplace_back(
        "ListCheckpoints",
        stub.ListCheckpoints(Context(token).get(), request, &response));
  }
  {
    v1::RollBackRequest request;
    request.set_job_id(job_id);
    request.set_fingerprint(fingerprint);
    v1::RollBackResponse response;
    results.emplace_back(
        "RollBack", stub.RollBack(Context(token).get(), request, &response));
  }
  {
    v1::ImportCheckpointRequest request;
    request.set_job_id(job_id);
    request.set_fingerprint(fingerprint);
    request.add_checkpoint_dirs("/nonexistent");
    v1::ImportCheckpointResponse response;
    results.emplace_back(
        "ImportCheckpoint",
        stub.ImportCheckpoint(Context(token).get(), request, &response));
  }
  {
    v1::PullRequest request;
    request.set_job_id(job_id);
    request.set_fingerprint(fingerprint);
    request.set_end(16);
    request.set_dtype(v1::DTYPE_FP32);
    auto context = Context(token);
    auto reader = stub.PullWeights(context.get(), request);
    v1::PullResponse response;
    while (reader->Read(&response)) {
    }
    results.emplace_back("PullWeights", reader->Finish());
  }
  {
    v1::ExportStateRequest request;
    request.set_job_id(job_id);
    request.set_fingerprint(fingerprint);
    auto context = Context(token);
    auto reader = stub.ExportState(context.get(), request);
    v1::StateChunk chunk;
    while (reader->Read(&chunk)) {
    }
    results.emplace_back("ExportState", reader->Finish());
  }
  {
    auto context = Context(token);
    v1::InitWeightsResponse response;
    auto writer = stub.InitWeights(context.get(), &response);
    v1::InitWeightsRequest request;
    request.mutable_header()->set_job_id(job_id);
    request.mutable_header()->set_fingerprint(fingerprint);
    request.mutable_header()->set_dtype(v1::DTYPE_FP32);
    writer->Write(request);
    writer->WritesDone();
    results.emplace_back("InitWeights", writer->Finish());
  }
  {
    auto context = Context(token);
    v1::ImportStateResponse response;
    auto writer = stub.ImportState(context.get(), &response);
    v1::ImportStateRequest request;
    request.mutable_header()->set_job_id(job_id);
    request.mutable_header()->set_fingerprint(fingerprint);
    writer->Write(request);
    writer->WritesDone();
    results.emplace_back("ImportState", writer->Finish());
  }
  {
    auto context = Context(token);
    auto stream = stub.Step(context.get());
    v1::StepRequest request;
    request.mutable_header()->set_job_id(job_id);
    request.mutable_header()->set_fingerprint(fingerprint);
    request.mutable_header()->set_step(1);
    stream->Write(request);
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
    }
    results.emplace_back("Step", stream->Finish());
  }
  {
    v1::DeleteJobRequest request;
    request.set_job_id(job_id);
    request.set_fingerprint(fingerprint);
    v1::DeleteJobResponse response;
    results.emplace_back(
        "DeleteJob", stub.DeleteJob(Context(token).get(), request, &response));
  }
  return results;
}

void ExpectHealthServing(const std::shared_ptr<grpc::Channel>& channel) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("depot.v1.Depot");
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status =
      health->Check(Context("").get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(SecurityTest, WithoutAValidTokenEveryRpcButHealthIsUnauthenticated) {
  std::unique_ptr<ServerProcess> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  std::shared_ptr<grpc::Channel> channel = TlsChannel(*server);
  auto stub = v1::Depot::NewStub(channel);
  for (const std::string& token : {std::string(), std::string("not-a-token"),
                                   std::string(kAlphaToken) + "x"}) {
    SCOPED_TRACE(absl::StrCat("token \"", token, "\""));
    for (const auto& [rpc, status] :
         CallEveryRpc(*stub, token, 1, 0, "intruder")) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << rpc << ": " << status.error_message();
    }
  }
  ExpectHealthServing(channel);
  // Nothing was created: alpha's first job is job 1, created afresh, and the
  // name the refused calls asked for is free.
  v1::CreateJobResponse created;
  const grpc::Status status =
      CreateJob(*stub, kAlphaToken, "intruder", &created);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(created.created());
  EXPECT_EQ(created.job_id(), 1u);
  EXPECT_THAT(server->Log(),
              HasSubstr("audit: CreateJob tenant=(unauthenticated) peer="));
}

// Job names are per tenant, in the checkpoint directory too: alpha's and
// beta's jobs "kept-run" (two configs) are checkpointed apart and restored
// to their tenants, each invisible to the other.
TEST_F(SecurityTest, RestoredJobsGoBackToTheirTenants) {
  const std::string checkpoint_dir = pki->path("checkpoints");
  const std::vector<std::string> flags = CheckpointingFlags(checkpoint_dir);
  constexpr double kBetaLr = 0.25;
  v1::CreateJobResponse alpha_job, beta_job;
  {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartTls(flags, pki->path("ca.pem"));
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = v1::Depot::NewStub(TlsChannel(**server));
    ASSERT_TRUE(CreateJob(*stub, kAlphaToken, "kept-run", &alpha_job).ok());
    ASSERT_TRUE(
        CreateJob(*stub, kBetaToken, "kept-run", &beta_job, kBetaLr).ok());
    ASSERT_TRUE(beta_job.created());
    ASSERT_NE(beta_job.job_id(), alpha_job.job_id());
    ASSERT_NE(beta_job.fingerprint(), alpha_job.fingerprint());
    for (const auto& [token, job] : {std::pair{kAlphaToken, &alpha_job},
                                     std::pair{kBetaToken, &beta_job}}) {
      const grpc::Status saved =
          Checkpoint(*stub, token, job->job_id(), job->fingerprint());
      ASSERT_TRUE(saved.ok()) << saved.error_message();
    }
    ASSERT_TRUE((*server)->Signal(SIGTERM).ok());
    ASSERT_TRUE((*server)->Wait(absl::Seconds(60)).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(checkpoint_dir + "/job-kept-run"));
  EXPECT_TRUE(std::filesystem::is_directory(checkpoint_dir +
                                            "/tenant-alpha/job-kept-run"));
  EXPECT_TRUE(std::filesystem::is_directory(checkpoint_dir +
                                            "/tenant-beta/job-kept-run"));
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartTls(flags, pki->path("ca.pem"));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Depot::NewStub(TlsChannel(**server));
  // Each tenant attaches to its own restored job (the config tells them
  // apart), and finds the other's id unknown.
  v1::CreateJobResponse alpha_again, beta_again;
  ASSERT_TRUE(CreateJob(*stub, kAlphaToken, "kept-run", &alpha_again).ok())
      << (*server)->Log();
  ASSERT_TRUE(
      CreateJob(*stub, kBetaToken, "kept-run", &beta_again, kBetaLr).ok());
  EXPECT_FALSE(alpha_again.created());
  EXPECT_FALSE(beta_again.created());
  EXPECT_EQ(alpha_again.fingerprint(), alpha_job.fingerprint());
  EXPECT_EQ(beta_again.fingerprint(), beta_job.fingerprint());
  EXPECT_NE(alpha_again.job_id(), beta_again.job_id());
  for (const auto& [token, other_id] :
       {std::pair{kAlphaToken, beta_again.job_id()},
        std::pair{kBetaToken, alpha_again.job_id()}}) {
    v1::GetJobRequest request;
    request.set_job_id(other_id);
    v1::JobStatus status;
    EXPECT_EQ(stub->GetJob(Context(token).get(), request, &status).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  v1::GetJobRequest request;
  request.set_job_id(alpha_again.job_id());
  v1::JobStatus status;
  ASSERT_TRUE(stub->GetJob(Context(kAlphaToken).get(), request, &status).ok());
  EXPECT_EQ(status.spec().name(), "kept-run");
  EXPECT_NE(status.spec().optimizer().lr(), kBetaLr);
}

// A checkpoint directory of the previous release: every job at the root,
// and the tenant of each in <dir>/tenants. The server moves alpha's job into
// alpha's directory as it starts, and it restores as alpha's.
TEST_F(SecurityTest, TheTenantsFileOfTheLastReleaseIsAdopted) {
  const std::string checkpoint_dir = pki->path("legacy-checkpoints");
  const std::vector<std::string> flags = CheckpointingFlags(checkpoint_dir);
  v1::CreateJobResponse alpha_job;
  {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartTls(flags, pki->path("ca.pem"));
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = v1::Depot::NewStub(TlsChannel(**server));
    ASSERT_TRUE(CreateJob(*stub, kAlphaToken, "old-run", &alpha_job).ok());
    ASSERT_TRUE(Checkpoint(*stub, kAlphaToken, alpha_job.job_id(),
                           alpha_job.fingerprint())
                    .ok());
    ASSERT_TRUE((*server)->Signal(SIGTERM).ok());
    ASSERT_TRUE((*server)->Wait(absl::Seconds(60)).ok());
  }
  // As the previous release left it: "old-run" is 6f6c642d72756e in hex.
  std::filesystem::rename(checkpoint_dir + "/tenant-alpha/job-old-run",
                          checkpoint_dir + "/job-old-run");
  std::ofstream(checkpoint_dir + "/tenants")
      << "# depot-server: the tenant of each job\nalpha 6f6c642d72756e\n";

  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartTls(flags, pki->path("ca.pem"));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->Log(), HasSubstr("moved 1 tenants' jobs"));
  EXPECT_FALSE(std::filesystem::exists(checkpoint_dir + "/tenants"));
  EXPECT_TRUE(std::filesystem::is_directory(checkpoint_dir +
                                            "/tenant-alpha/job-old-run"));
  auto stub = v1::Depot::NewStub(TlsChannel(**server));
  v1::CreateJobResponse attached;
  ASSERT_TRUE(CreateJob(*stub, kAlphaToken, "old-run", &attached).ok());
  EXPECT_FALSE(attached.created()) << (*server)->Log();
  EXPECT_EQ(attached.fingerprint(), alpha_job.fingerprint());
  v1::GetJobRequest request;
  request.set_job_id(attached.job_id());
  v1::JobStatus status;
  EXPECT_EQ(
      stub->GetJob(Context(kBetaToken).get(), request, &status).error_code(),
      grpc::StatusCode::NOT_FOUND);
}

TEST_F(SecurityTest, PlaintextCallsToATlsServerFail) {
  std::unique_ptr<ServerProcess> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Depot::NewStub(grpc::CreateChannel(
      server->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::CreateJobResponse response;
  EXPECT_EQ(CreateJob(*stub, kAlphaToken, "plain", &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, AnotherTenantsJobsAreNotFound) {
  std::unique_ptr<ServerProcess> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Depot::NewStub(TlsChannel(*server));
  v1::CreateJobResponse alpha_job;
  ASSERT_TRUE(CreateJob(*stub, kAlphaToken, "alpha-run", &alpha_job).ok());
  v1::JobStatus before;
  {
    v1::GetJobRequest request;
    request.set_job_id(alpha_job.job_id());
    request.set_with_checksum(true);
    ASSERT_TRUE(
        stub->GetJob(Context(kAlphaToken).get(), request, &before).ok());
  }

  // Beta sees exactly what it sees for an id that does not exist.
  {
    v1::GetJobRequest request;
    request.set_job_id(alpha_job.job_id());
    v1::JobStatus response;
    const grpc::Status status =
        stub->GetJob(Context(kBetaToken).get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(status.error_message(),
              absl::StrCat("job ", alpha_job.job_id(), " not found"));
  }
  for (const auto& [rpc, status] :
       CallEveryRpc(*stub, kBetaToken, alpha_job.job_id(),
                    alpha_job.fingerprint(), "beta-run")) {
    if (rpc == "CreateJob") {
      EXPECT_TRUE(status.ok()) << status.error_message();
      continue;
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
        << rpc << ": " << status.error_message();
  }
  // Even a wrong fingerprint says NOT_FOUND, not "fingerprint mismatch".
  {
    v1::DeleteJobRequest request;
    request.set_job_id(alpha_job.job_id());
    request.set_fingerprint(alpha_job.fingerprint() + 1);
    v1::DeleteJobResponse response;
    EXPECT_EQ(stub->DeleteJob(Context(kBetaToken).get(), request, &response)
                  .error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Job names are per tenant: beta's "alpha-run" is a job of its own, which
  // says nothing of alpha's (not even that it exists), and alpha's job is
  // untouched.
  v1::CreateJobResponse own;
  ASSERT_TRUE(CreateJob(*stub, kBetaToken, "alpha-run", &own, 0.5).ok());
  EXPECT_TRUE(own.created());
  EXPECT_NE(own.job_id(), alpha_job.job_id());
  v1::CreateJobResponse attached;
  ASSERT_TRUE(CreateJob(*stub, kAlphaToken, "alpha-run", &attached).ok());
  EXPECT_FALSE(attached.created());
  EXPECT_EQ(attached.job_id(), alpha_job.job_id());

  v1::JobStatus after;
  {
    v1::GetJobRequest request;
    request.set_job_id(alpha_job.job_id());
    request.set_with_checksum(true);
    ASSERT_TRUE(stub->GetJob(Context(kAlphaToken).get(), request, &after).ok());
  }
  EXPECT_EQ(after.state_checksum(), before.state_checksum());
  EXPECT_EQ(after.step(), before.step());
  EXPECT_THAT(server->Log(),
              HasSubstr("audit: DeleteJob tenant=\"beta\" peer="));
  EXPECT_THAT(server->Log(),
              HasSubstr(absl::StrCat(
                  "audit: CreateJob tenant=\"alpha\" peer=ipv4:127.0.0.1:")));
  EXPECT_THAT(server->Log(), HasSubstr(absl::StrCat("job ", alpha_job.job_id(),
                                                    " \"alpha-run\": OK")));
}

TEST_F(SecurityTest, ClientTrainsOverTlsWithATokenFile) {
  std::unique_ptr<ServerProcess> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.servers = {server->grpc_address()};
  options.tls_ca_file = pki->path("ca.pem");
  options.auth_token_file = pki->path("alpha.token");
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForServers(absl::Seconds(30)).ok());
  absl::StatusOr<std::unique_ptr<Job>> job =
      (*client)->OpenJob(SmallJobConfig("trained", 1, 1), 0);
  ASSERT_TRUE(job.ok()) << job.status();
  const Layout& layout = (*job)->layout();
  const std::string initial = MakeInitialWeights(layout, DType::kFloat32, 7);
  ASSERT_TRUE((*job)->InitWeights(initial.data(), DType::kFloat32).ok());
  std::string weights(initial.size(), '\0');
  for (uint64_t step = 1; step <= 2; ++step) {
    const std::string grads =
        MakeGradients(layout, DType::kFloat32, 7, step, 0);
    const absl::Status s =
        (*job)->Step(step, grads.data(), weights.data(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_NE(weights, initial);
  EXPECT_THAT(server->Log(),
              HasSubstr("audit: InitWeights tenant=\"alpha\" peer="));

  // Beta's client does not see alpha's job: its OpenJob of the same name
  // opens a job of beta's own, which starts from its own weights.
  options.auth_token_file.clear();
  options.auth_token = kBetaToken;
  absl::StatusOr<std::unique_ptr<Client>> beta = Client::Connect(options);
  ASSERT_TRUE(beta.ok()) << beta.status();
  absl::StatusOr<std::unique_ptr<Job>> beta_job =
      (*beta)->OpenJob(SmallJobConfig("trained", 1, 1), 0);
  ASSERT_TRUE(beta_job.ok()) << beta_job.status();
  const std::string beta_initial =
      MakeInitialWeights(layout, DType::kFloat32, 8);
  ASSERT_TRUE(
      (*beta_job)->InitWeights(beta_initial.data(), DType::kFloat32).ok());
  std::string beta_weights(beta_initial.size(), '\0');
  ASSERT_TRUE((*beta_job)
                  ->Step(1,
                         MakeGradients(layout, DType::kFloat32, 8, 1, 0).data(),
                         beta_weights.data(), nullptr)
                  .ok());
  // Alpha's job goes on from step 2, its weights its own.
  std::string next(initial.size(), '\0');
  const std::string grads = MakeGradients(layout, DType::kFloat32, 7, 3, 0);
  ASSERT_TRUE((*job)->Step(3, grads.data(), next.data(), nullptr).ok());
  EXPECT_NE(next, weights);
  EXPECT_NE(beta_weights, weights);
}

TEST_F(SecurityTest, ClientWithoutTokenIsUnauthenticated) {
  std::unique_ptr<ServerProcess> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.servers = {server->grpc_address()};
  options.tls_ca_file = pki->path("ca.pem");
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  // Health stays open: waiting for the servers works without a token.
  ASSERT_TRUE((*client)->WaitForServers(absl::Seconds(30)).ok());
  EXPECT_EQ(
      (*client)->OpenJob(SmallJobConfig("no-token", 1, 1), 0).status().code(),
      absl::StatusCode::kUnauthenticated);
}

TEST_F(SecurityTest, ClientRefusesToSendATokenInClearText) {
  ClientOptions options;
  options.servers = {"127.0.0.1:50051"};
  options.auth_token = kAlphaToken;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("tls_ca_file"));
  options.tls_ca_file = pki->path("does-not-exist.pem");
  client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("does-not-exist.pem"));
}

TEST_F(SecurityTest, MutualTlsNamesTheTenantByCertificate) {
  std::unique_ptr<ServerProcess> server = StartMutualTlsServer();
  ASSERT_NE(server, nullptr);
  // No certificate: health answers, the Depot RPCs do not.
  std::shared_ptr<grpc::Channel> anonymous = TlsChannel(*server);
  ExpectHealthServing(anonymous);
  for (const auto& [rpc, status] :
       CallEveryRpc(*v1::Depot::NewStub(anonymous), "", 1, 0, "anon")) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << rpc << ": " << status.error_message();
  }
  auto alpha = v1::Depot::NewStub(TlsChannel(*server, "alpha"));
  v1::CreateJobResponse alpha_job;
  const grpc::Status created =
      CreateJob(*alpha, "", "alpha-cert-run", &alpha_job);
  ASSERT_TRUE(created.ok()) << created.error_message();
  EXPECT_EQ(alpha_job.job_id(), 1u);  // the anonymous CreateJob made nothing

  auto beta = v1::Depot::NewStub(TlsChannel(*server, "beta"));
  v1::GetJobRequest request;
  request.set_job_id(alpha_job.job_id());
  v1::JobStatus status;
  EXPECT_EQ(beta->GetJob(Context("").get(), request, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(alpha->GetJob(Context("").get(), request, &status).ok());

  // A certificate from a CA the server does not trust gets nowhere, even
  // with alpha's name in it.
  auto rogue = v1::Depot::NewStub(TlsChannel(*server, "rogue"));
  const grpc::Status refused =
      rogue->GetJob(Context("").get(), request, &status);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SecurityTest, ClientPresentsItsCertificateForMutualTls) {
  std::unique_ptr<ServerProcess> server = StartMutualTlsServer();
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.servers = {server->grpc_address()};
  options.tls_ca_file = pki->path("ca.pem");
  options.tls_cert_file = pki->path("alpha.pem");
  options.tls_key_file = pki->path("alpha.key");
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::unique_ptr<Job>> job =
      (*client)->OpenJob(SmallJobConfig("by-certificate", 1, 1), 0);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(server->Log(), HasSubstr("audit: CreateJob tenant=\"alpha\""));

  options.tls_key_file.clear();
  EXPECT_EQ(Client::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SecurityTest, WithTokensAndClientCertificatesBothAreRequired) {
  std::vector<std::string> flags = TlsFlags();
  flags.push_back("--auth_token_file=" + pki->path("tokens"));
  flags.push_back("--tls_client_ca=" + pki->path("ca.pem"));
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartTls(flags, pki->path("ca.pem"));
  ASSERT_TRUE(server.ok()) << server.status();
  v1::CreateJobResponse response;
  auto no_certificate = v1::Depot::NewStub(TlsChannel(**server));
  EXPECT_EQ(
      CreateJob(*no_certificate, kBetaToken, "both", &response).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  auto alpha_certificate = v1::Depot::NewStub(TlsChannel(**server, "alpha"));
  EXPECT_EQ(CreateJob(*alpha_certificate, "", "both", &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // The token names the tenant; the certificate only lets the caller in.
  const grpc::Status created =
      CreateJob(*alpha_certificate, kBetaToken, "both", &response);
  ASSERT_TRUE(created.ok()) << created.error_message();
  EXPECT_EQ(response.job_id(), 1u);
  EXPECT_THAT((*server)->Log(), HasSubstr("audit: CreateJob tenant=\"beta\""));
}

TEST_F(SecurityTest, ServerRefusesTokensWithoutTls) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Spawn(
      ServerProcess::DefaultBinary(),
      {"--listen=127.0.0.1:0",
       "--metrics_listen=", "--auth_token_file=" + pki->path("tokens")});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<ProcessExit> exit = (*server)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->ExitedWith(2)) << (*server)->Log();
  EXPECT_THAT((*server)->Log(),
              HasSubstr("--auth_token_file needs --tls_cert"));
}

TEST_F(SecurityTest, ServerRefusesAMalformedTokenFile) {
  WriteText(pki->path("bad-tokens"), "alpha 1234\n");
  std::vector<std::string> args = {
      "--listen=127.0.0.1:0",
      "--metrics_listen=", "--auth_token_file=" + pki->path("bad-tokens")};
  for (const std::string& flag : TlsFlags()) args.push_back(flag);
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Spawn(ServerProcess::DefaultBinary(), args);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<ProcessExit> exit = (*server)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_FALSE(exit->ExitedWith(0)) << (*server)->Log();
  EXPECT_THAT((*server)->Log(),
              HasSubstr("line 1: expected \"TENANT SHA256-HEX\""));
}

TEST_F(SecurityTest, HashTokenPrintsWhatOpensslPrints) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Spawn(
      "/bin/sh",
      {"-c", absl::StrCat("printf '%s\\n' '", kAlphaToken, "' | '",
                          ServerProcess::DefaultBinary(), "' --hash_token")});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<ProcessExit> exit = (*server)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->ExitedWith(0)) << (*server)->Log();
  const std::string tokens = ReadText(pki->path("tokens"));
  const std::string printed(absl::StripAsciiWhitespace((*server)->Log()));
  ASSERT_EQ(printed.size(), 64u) << printed;
  EXPECT_THAT(tokens, HasSubstr(absl::StrCat("alpha ", printed)));
}

}  // namespace
}  // namespace depot::testing
