"""python -m infera.engine.echo --model m --listen-port 8000 …: one flat flag list."""

from infera_core.cli.alias import flat_main_for

if __name__ == "__main__":
    flat_main_for("echo")()
