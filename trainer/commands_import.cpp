// `qlora import-gguf`: the CLI face of trainer/import_gguf.h.
#include <sstream>

#include "trainer/commands.h"

namespace qlora {

std::string cmd_import_gguf(const ImportGgufOptions& o) {
  const ImportGgufResult r = import_gguf(o);
  std::ostringstream os;
  os << "imported " << o.gguf_path << " (" << r.architecture << ", " << r.tensors << " tensors, "
     << r.parameters << " parameters" << (r.tied_embeddings ? ", tied embeddings" : "") << ") into "
     << o.out_dir << " as " << o.dtype << " in " << r.seconds << " s\n";
  return os.str();
}

}  // namespace qlora
