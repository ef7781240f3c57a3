//! `tailguard-mock`: runs mock LLM replicas from the command line.

fn main() {
    eprintln!("tailguard-mock: command line not landed yet");
}
