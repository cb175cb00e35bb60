"""Running trainers and servers as separate network hosts on one machine."""
