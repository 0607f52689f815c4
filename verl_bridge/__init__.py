"""The optional bridge to verl / verl-agent (its own virtual environment: install_verl.sh)."""
