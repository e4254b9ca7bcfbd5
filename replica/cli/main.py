def main() -> None:
    print("quorumlog")
