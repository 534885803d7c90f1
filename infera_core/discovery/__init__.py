"""Worker discovery backends: etcd, memory, static file."""
