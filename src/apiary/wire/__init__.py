"""The only importer of generated protobuf code: message modules and proto <-> core converters."""
