#include "protocol/round_start.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace xsilo::protocol {

std::string round_start_statement(const wire::RoundStart& rs, const std::string& federation) {
  wire::RoundStart unsigned_part = rs;
  unsigned_part.clear_server_certificate();
  unsigned_part.clear_server_signature();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    unsigned_part.SerializeToCodedStream(&coded);
  }
  return crypto::statement("round-start", {federation, bytes});
}

void sign_round_start(wire::RoundStart& rs, const crypto::CertSigner& server, const std::string& federation) {
  rs.set_server_certificate(server.certificate());
  rs.set_server_signature(server.sign(round_start_statement(rs, federation)));
}

std::string round_start_signer(const wire::RoundStart& rs, const crypto::CertVerifier& ca,
                               const std::string& federation, std::string& why) {
  if (rs.server_certificate().empty()) {
    why = "the round start is not signed by a server";
    return "";
  }
  auto server = ca.certified(rs.server_certificate(), "server", why);
  if (!server) {
    why = "the round start carries no valid server certificate: " + why;
    return "";
  }
  why = ca.verify(rs.server_certificate(), server->name, "server", round_start_statement(rs, federation),
                  rs.server_signature());
  if (!why.empty()) {
    why = "the round start is not signed by server " + server->name + " (" + why + ")";
    return "";
  }
  return server->name;
}

}  // namespace xsilo::protocol
