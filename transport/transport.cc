#include "transport/transport.h"

namespace trainyard {

const char* MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kEvalActivation:
      return "eval-activation";
    case MessageKind::kSnapshot:
      return "snapshot";
  }
  return "?";
}

}  // namespace trainyard
