"""Small leaf helpers with no Infera dependencies: modules here import nothing from ``infera_core``."""
