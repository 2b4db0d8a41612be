#include "server/responses.h"

namespace strata {

using json = nlohmann::json;

http::Response json_response(int status, const json& body) {
  return http::Response{.status = status, .body = dump_json(body)};
}

http::Response error_response(int status, const std::string& message, const std::string& code) {
  return json_response(status, error_json(status, message, code));
}

http::Response error_response(const Error& e) {
  return error_response(http_status(e.code), e.message, std::string(error_code_name(e.code)));
}

}  // namespace strata
