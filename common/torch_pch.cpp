// The translation unit that builds the shared precompiled <torch/torch.h> (qlora_torch_pch in the
// root CMakeLists.txt). It has no code of its own.
