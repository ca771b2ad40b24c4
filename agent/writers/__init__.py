"""Writers: state files, spools and upload queues (I/O that persists or sends, beside the readers)."""
