// The coordinator bad-input tests' helpers: NCCL ids, deadlines,
// deterministic bytes of a message, and valid requests.
#include "tests/coordinator_bad_input_fixture.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace muonps {
namespace bad_input_test {

std::string NcclId(char fill) { return std::string(128, fill); }

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

std::string Deterministic(const google::protobuf::Message& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

v1::CreateJobRequest ValidCreate(const std::string& name) {
  v1::CreateJobRequest r;
  r.set_request_id(name + "-create");
  r.mutable_job()->set_name(name);
  for (const char* matrix : {"layers.0.w", "layers.1.w"}) {
    v1::Matrix* m = r.mutable_job()->add_matrices();
    m->set_name(matrix);
    m->set_rows(64);
    m->set_cols(128);
  }
  return r;
}

v1::JoinJobRequest ValidJoin(const std::string& job, const std::string& worker,
                             const std::string& instance) {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id(instance);
  r.mutable_device()->set_kind("cpu");
  r.mutable_device()->set_memory_bytes(int64_t{8} << 30);
  return r;
}

}  // namespace bad_input_test
}  // namespace muonps
