// xsilo pki init | issue | revoke: the federation CA, one kit folder per participant, and the
// CA's revocation list.
#include <iostream>

#include "common/config.h"
#include "tools/commands.h"
#include "transport/pki.h"
#include "transport/tls.h"

namespace xsilo::tools {

namespace {

// The --key option of init, issue and renew: p256 or ed25519, else a usage error naming `cmd`.
transport::KeyType key_type(const std::string& key, const std::string& cmd) {
  if (key == "p256") return transport::KeyType::P256;
  if (key == "ed25519") return transport::KeyType::Ed25519;
  throw ConfigError(cmd + ": --key must be p256 or ed25519");
}

// `pki init`: a new federation CA.
void add_pki_init(CLI::App& pki, int& exit_code) {
  struct InitOpts {
    std::string out = "pki", federation = "xsilo", key = "p256";
    int days = 3650;
  };
  auto init = std::make_shared<InitOpts>();
  auto* cmd_init = pki.add_subcommand("init", "create a federation CA in DIR/ca");
  cmd_init->add_option("--out", init->out, "PKI folder")->capture_default_str();
  cmd_init->add_option("--federation", init->federation, "federation name (the CA's O=)")
      ->capture_default_str();
  cmd_init->add_option("--days", init->days, "validity in days")->capture_default_str();
  cmd_init->add_option("--key", init->key, "key type: p256 or ed25519")->capture_default_str();
  cmd_init->callback([init, &exit_code] {
    transport::pki_init(init->out, init->federation, init->days, key_type(init->key, "pki init"));
    std::cout << "created federation CA in " << init->out << "/ca (keep ca.key offline)\n";
    exit_code = 0;
  });
}

// `pki issue`: a key and certificate for one participant.
void add_pki_issue(CLI::App& pki, int& exit_code) {
  struct IssueOpts {
    std::string pki = "pki", role, name, key = "p256";
    int days = 365;
  };
  auto issue = std::make_shared<IssueOpts>();
  auto* cmd_issue = pki.add_subcommand("issue", "issue a key and certificate as DIR/kits/NAME");
  cmd_issue->add_option("--pki", issue->pki, "PKI folder made by pki init")->capture_default_str();
  cmd_issue->add_option("--role", issue->role, "server, edge, silo or admin (an operator: xsilo status, xsilo admin)")->required();
  cmd_issue->add_option("--name", issue->name, "participant name (certificate CN)")->required();
  cmd_issue->add_option("--days", issue->days, "validity in days")->capture_default_str();
  cmd_issue->add_option("--key", issue->key, "key type: p256 or ed25519")->capture_default_str();
  cmd_issue->callback([issue, &exit_code] {
    transport::IssueRequest req;
    try {
      req.role = transport::parse_role(issue->role);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("pki issue: --role: ") + e.what());
    }
    req.key = key_type(issue->key, "pki issue");
    req.name = issue->name;
    req.days = issue->days;
    std::filesystem::path kit;
    try {
      kit = transport::pki_issue(issue->pki, req);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("pki issue: ") + e.what());
    }
    std::cout << "issued " << issue->role << " " << issue->name << ": hand over the folder "
              << kit.string() << " (key.pem, cert.pem, ca.pem)\n";
    exit_code = 0;
  });
}

// `pki revoke`: a certificate onto the CA's revocation list.
void add_pki_revoke(CLI::App& pki, int& exit_code) {
  struct RevokeOpts {
    std::string pki = "pki";
    std::string name, serial;
    int days = 365;
    bool refresh = false;
  };
  auto revoke = std::make_shared<RevokeOpts>();
  auto* cmd_revoke = pki.add_subcommand("revoke", "revoke a participant's certificate (DIR/ca/crl.pem)");
  cmd_revoke->add_option("--pki", revoke->pki, "PKI folder made by pki init")->capture_default_str();
  cmd_revoke->add_option("--name", revoke->name, "the participant whose kit DIR/kits/NAME is revoked (its certificate now)");
  cmd_revoke->add_option("--serial", revoke->serial,
                         "any certificate this CA issued, by its serial (xsilo pki list), e.g. an older one");
  cmd_revoke->add_flag("--refresh", revoke->refresh, "only re-sign the list with a new validity");
  cmd_revoke->add_option("--days", revoke->days, "the list's validity in days; refresh it before then")
      ->capture_default_str();
  cmd_revoke->callback([revoke, &exit_code] {
    const int given = !revoke->name.empty() + !revoke->serial.empty() + revoke->refresh;
    if (given != 1) throw ConfigError("pki revoke: give one of --name NAME, --serial HEX or --refresh");
    std::size_t n = 0;
    try {
      n = transport::pki_revoke(revoke->pki, revoke->name, revoke->days, revoke->serial);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("pki revoke: ") + e.what());
    }
    const std::string what = !revoke->name.empty() ? "revoked " + revoke->name + ";"
                             : !revoke->serial.empty() ? "revoked serial " + revoke->serial + ";"
                                                       : "refreshed";
    std::cout << what << " the revocation list "
              << revoke->pki << "/ca/crl.pem names " << n << " certificate" << (n == 1 ? "" : "s") << ", valid "
              << revoke->days << " days.\nIt was copied into every kit under " << revoke->pki
              << "/kits; give it to every participant (as crl.pem in its kit, or tls.crl) and restart them.\n";
    exit_code = 0;
  });
}

// `pki renew`: a fresh key and certificate for an existing kit.
void add_pki_renew(CLI::App& pki, int& exit_code) {
  struct RenewOpts {
    std::string pki = "pki", name, key;
    int days = 365;
    bool keep_old = false;
  };
  auto renew = std::make_shared<RenewOpts>();
  auto* cmd_renew = pki.add_subcommand("renew", "issue a fresh key and certificate for an existing kit DIR/kits/NAME");
  cmd_renew->add_option("--pki", renew->pki, "PKI folder made by pki init")->capture_default_str();
  cmd_renew->add_option("--name", renew->name, "the participant whose kit is renewed (its role is kept)")->required();
  cmd_renew->add_option("--days", renew->days, "validity in days")->capture_default_str();
  cmd_renew->add_option("--key", renew->key, "key type: p256 or ed25519 (default: the kit's current type)");
  cmd_renew->add_flag("--keep-old", renew->keep_old,
                      "leave the old certificate valid until it expires (by default it is revoked)");
  cmd_renew->callback([renew, &exit_code] {
    std::optional<transport::KeyType> key;
    if (!renew->key.empty()) key = key_type(renew->key, "pki renew");
    std::filesystem::path kit;
    try {
      kit = transport::pki_renew(renew->pki, renew->name, renew->days, key, renew->keep_old);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("pki renew: ") + e.what());
    }
    const auto id = transport::own_identity(transport::TlsFiles::from_kit(kit));
    std::cout << "renewed " << id.str() << ": a new key and certificate, valid until " << transport::utc_day(id.not_after)
              << ". Hand over the folder " << kit.string()
              << " and restart the participant with it. "
              << (renew->keep_old ? "Its old certificate stays valid until it expires (--keep-old); revoke it later "
                                    "with `xsilo pki revoke --serial` (xsilo pki list shows it).\n"
                                  : "Its old certificate is revoked: the new revocation list is in every kit under " +
                                        renew->pki + "/kits; give it to the other participants and restart them.\n");
    exit_code = 0;
  });
}

// `pki list`: every certificate the CA issued.
void add_pki_list(CLI::App& pki, int& exit_code) {
  auto list_pki = std::make_shared<std::string>("pki");
  auto* cmd_list = pki.add_subcommand("list", "every certificate this CA issued (DIR/ca/index.jsonl): serial, name, role, expiry, and REVOKED for those its revocation list names");
  cmd_list->add_option("--pki", *list_pki, "PKI folder made by pki init")->capture_default_str();
  cmd_list->callback([list_pki, &exit_code] {
    for (const auto& c : transport::pki_index(*list_pki)) {
      std::cout << c.serial << "  " << c.role << "  " << c.name << "  until " << c.not_after
                << (c.revoked ? "  REVOKED (in crl.pem)" : "") << "\n";
    }
    exit_code = 0;
  });
}

}  // namespace

void add_pki(CLI::App& app, int& exit_code) {
  auto* pki = app.add_subcommand("pki", "create the federation CA and issue participant kits");
  pki->require_subcommand(1);

  add_pki_init(*pki, exit_code);
  add_pki_issue(*pki, exit_code);
  add_pki_revoke(*pki, exit_code);
  add_pki_renew(*pki, exit_code);
  add_pki_list(*pki, exit_code);
}

}  // namespace xsilo::tools
